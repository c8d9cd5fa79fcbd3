"""The optional compiled modules (`tensorscope/_diffkernel.c`, `tensorscope/_zipscan.c`,
`tensorscope/_torchstep.c`), built by
`pip install` where a C compiler is; each has a pure-Python twin that gives the same results."""
from __future__ import annotations

import importlib
from types import ModuleType


def optional_extension(name: str, abi: int) -> ModuleType | None:
    """``tensorscope.<name>`` when it is built and says it is ``abi`` (a stale build of an editable
    install is ignored, never called), else None."""
    try:
        module = importlib.import_module(f"tensorscope.{name}")
    except ImportError:
        return None
    return module if getattr(module, "ABI", None) == abi else None
