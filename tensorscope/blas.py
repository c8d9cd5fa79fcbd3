"""numpy's own OpenBLAS, called where numpy's wrappers cost more than the work.

Two uses, both optional (where the library or a symbol is missing, callers keep numpy's route):

- `single_thread()`: pin the calling thread's BLAS to one thread (the diff's pool has a thread per
  core; OpenBLAS threads of its own would fight them).
- `cholesky_succeeds(m)`: LAPACK ``dpotrf`` on a symmetric matrix, in place: whether it is
  positive definite. The rank test asks this once per changed matrix of a diff (a 160 x 160 Gram
  matrix); ``numpy.linalg.cholesky`` takes 0.27 ms for it, of which ``dpotrf`` itself is 0.08 ms
  (the gufunc copies in and out, fills the upper triangle with zeros and raises through an errstate
  callback: measured on one core).

The library is found among those the process has loaded (numpy loaded it); nothing is loaded from
elsewhere, and no symbol is called whose integer width is not known from its name.
"""
from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

__all__ = ["openblas", "single_thread", "cholesky_succeeds"]


@functools.lru_cache(maxsize=1)
def openblas():
    """numpy's OpenBLAS when it can pin a thread's BLAS calls to one thread
    (``openblas_set_num_threads_local``, OpenBLAS >= 0.3.27), else None."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split(None, 5)[-1].strip() for line in f
                            if "openblas" in line.lower() and ".so" in line})
        for path in paths:
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LOCAL)
            if hasattr(lib, "openblas_set_num_threads_local"):
                return lib
    except (OSError, ValueError, AttributeError):
        return None  # not Linux, or not OpenBLAS
    return None


def single_thread() -> None:
    """Pin the calling thread's BLAS to one thread (a no-op without `openblas`)."""
    lib = openblas()
    if lib is not None:
        lib.openblas_set_num_threads_local(1)


# dpotrf's names with 64-bit integers: scipy-openblas64 (numpy's wheels) and OpenBLAS built with
# INTERFACE64 and the 64_ suffix. A bare ``dpotrf_`` may take 32- or 64-bit integers: not used.
_POTRF64 = ("scipy_dpotrf_64_", "dpotrf_64_")


@functools.lru_cache(maxsize=1)
def _potrf():
    lib = openblas()
    for name in _POTRF64 if lib is not None else ():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = None
            fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]
            return fn
    return None


def cholesky_succeeds(m: np.ndarray) -> bool:
    """Whether the symmetric float64 matrix ``m`` (square, C-contiguous, writable, finite) is
    positive definite, by Cholesky: LAPACK ``dpotrf`` in place when numpy's OpenBLAS has it (``m``
    is overwritten), else ``numpy.linalg.cholesky`` (``m`` is left as it was). Both read one
    triangle: the same factorisation, so the same answer."""
    n = m.shape[0]
    if not (m.ndim == 2 and m.shape == (n, n) and m.dtype == np.float64
            and m.flags.c_contiguous and m.flags.writeable):
        raise ValueError("cholesky_succeeds: a square, C-contiguous, writable float64 matrix")
    fn = _potrf()
    if fn is None or n == 0:
        try:
            np.linalg.cholesky(m)
            return True
        except np.linalg.LinAlgError:
            return False
    # symmetric, so its C order is its Fortran order: 'L' reads the triangle numpy's 'L' reads
    # transposed, which holds the same values
    size, info = ctypes.c_int64(n), ctypes.c_int64(0)
    fn(b"L", ctypes.byref(size), m.ctypes.data, ctypes.byref(size), ctypes.byref(info))
    return info.value == 0
