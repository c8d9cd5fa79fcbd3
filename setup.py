"""Build hook for the optional C extensions: the diff's one-pass statistics (`_diffkernel`),
the zip reader's plain-member step (`_zipscan`), the pickle VM's torch step (`_torchstep`),
the safetensors header's fast path (`_stheader`), the rows of `inspect --json` (`_jsonrows`) and
the grouping pass (`_groupscan`).

Everything else is declared in pyproject.toml. ``optional=True``: without a C compiler the
install still succeeds, `tensorscope.diffing` computes the same figures with numpy and
`parsers.zipfmt` reads every entry in Python, `parsers.pickle_vm` runs its Python torch step.

The user's ``CFLAGS`` win: setuptools puts ``extra_compile_args`` after them on the command line
(the last ``-O`` wins), so each flag of ours is added only when ``CFLAGS`` says nothing of its
kind (``CFLAGS="-O0 -g"`` is a debug build, ``-fsanitize=...`` a sanitizer build:
`.ci/sanitize.sh`).
"""
import os
import re

from setuptools import Extension, setup

_USER = f"{os.environ.get('CFLAGS', '')} {os.environ.get('CPPFLAGS', '')}"
# (our flag, the pattern of user flags of the same kind)
_OURS = [("-O3", r"-O\S*"), ("-fopenmp-simd", r"-f(no-)?openmp(-simd)?"),
         ("-fno-trapping-math", r"-f(no-)?trapping-math")]
FLAGS = [flag for flag, kind in _OURS if not re.search(rf"(?:^|\s){kind}(?:\s|$)", _USER)]
# each held to a Python twin; optional: without a compiler the twins give the same results
EXTENSIONS = ("_diffkernel", "_zipscan", "_torchstep", "_statskernel", "_stheader", "_jsonrows",
              "_groupscan")
setup(ext_modules=[Extension(f"tensorscope.{name}", [f"tensorscope/{name}.c"],
                             extra_compile_args=FLAGS, optional=True) for name in EXTENSIONS])
