"""Build hook for the optional C extensions: the diff's one-pass statistics (`_diffkernel`) and
the zip reader's plain-member step (`_zipscan`).

Everything else is declared in pyproject.toml. ``optional=True``: without a C compiler the
install still succeeds, `tensorscope.diffing` computes the same figures with numpy and
`parsers.zipfmt` reads every entry in Python.
"""
from setuptools import Extension, setup

FLAGS = ["-O3", "-fopenmp-simd", "-fno-trapping-math"]
setup(ext_modules=[
    Extension("tensorscope._diffkernel", ["tensorscope/_diffkernel.c"], extra_compile_args=FLAGS,
              optional=True),
    Extension("tensorscope._zipscan", ["tensorscope/_zipscan.c"], extra_compile_args=FLAGS,
              optional=True),
])
