"""Build hook for the one optional C extension (the diff's one-pass statistics).

Everything else is declared in pyproject.toml. ``optional=True``: without a C compiler the
install still succeeds and `tensorscope.diffing` computes the same figures with numpy.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("tensorscope._diffkernel", ["tensorscope/_diffkernel.c"],
                             extra_compile_args=["-O3", "-fopenmp-simd", "-fno-trapping-math"], optional=True)])
