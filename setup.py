"""Build hook for the optional C extensions: the diff's one-pass statistics (`_diffkernel`),
the zip reader's plain-member step (`_zipscan`) and the pickle VM's torch step (`_torchstep`).

Everything else is declared in pyproject.toml. ``optional=True``: without a C compiler the
install still succeeds, `tensorscope.diffing` computes the same figures with numpy and
`parsers.zipfmt` reads every entry in Python, `parsers.pickle_vm` runs its Python torch step.
"""
from setuptools import Extension, setup

FLAGS = ["-O3", "-fopenmp-simd", "-fno-trapping-math"]
setup(ext_modules=[
    Extension("tensorscope._diffkernel", ["tensorscope/_diffkernel.c"], extra_compile_args=FLAGS,
              optional=True),
    Extension("tensorscope._zipscan", ["tensorscope/_zipscan.c"], extra_compile_args=FLAGS,
              optional=True),
    Extension("tensorscope._torchstep", ["tensorscope/_torchstep.c"], extra_compile_args=FLAGS,
              optional=True),
    Extension("tensorscope._statskernel", ["tensorscope/_statskernel.c"], extra_compile_args=FLAGS,
              optional=True),
])
