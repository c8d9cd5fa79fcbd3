"""Container hooks of the pickle VM: inert rebuilds of the few builtins that pickles reach
through REDUCE (``OrderedDict``, ``defaultdict``, ``set``, ``frozenset``, ``bytes``, ``bytearray``,
``_codecs.encode``), and the guard that bounds the work of hashing tuples (dict keys, set items)
that the hooks and the VM share.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from tensorscope.errors import LimitExceeded
from tensorscope.parsers.pickle_values import DEFAULT_LIMITS, PickleError, UnhashableKey

# Tuple elements hashed per run (see _HashGuard): ~1 s of hashing, far above any real pickle.
_MAX_HASH_WORK = 100_000_000
# Encodings that the bytes/bytearray/_codecs.encode hooks accept. An encoding name from a file is
# never handed to codecs.lookup: that imports a module named by the file.
_SAFE_ENCODINGS = {"latin1": "latin-1", "latin-1": "latin-1", "iso-8859-1": "latin-1",
                   "iso8859-1": "latin-1", "utf-8": "utf-8", "utf8": "utf-8", "ascii": "ascii"}


# ---------------------------------------------------------------------------------------------
# Container hooks: inert rebuilds of the few builtins that pickles reach through REDUCE.

class _Unmodelled(PickleError):
    """A container hook cannot model these arguments. The VM then pushes the inert `Call`
    (as for `DECLINE`) and goes on: the real callee might accept them (``bytes(5)``, a stand-in
    class), so stopping here would hide the rest of the pickle from the scan."""


def _hook_error(what: str, args: tuple) -> PickleError:
    kinds = ", ".join(type(a).__name__ for a in args)
    return _Unmodelled(f"{what} called with unsupported arguments ({kinds})")


def _pairs_to_dict(what: str, pairs: Any) -> dict:
    out: dict = {}
    if type(pairs) is dict:
        return dict(pairs)
    if type(pairs) not in (list, tuple):
        raise _hook_error(what, (pairs,))
    for pair in pairs:
        if type(pair) not in (list, tuple) or len(pair) != 2:
            raise _Unmodelled(f"{what} wants (key, value) pairs, got {type(pair).__name__}")
        _set_key(out, pair[0], pair[1])
    return out


def _ordered_dict(args: tuple, pos: int) -> dict:
    if not args:
        return {}
    if len(args) == 1:
        return _pairs_to_dict("collections.OrderedDict", args[0])
    raise _hook_error("collections.OrderedDict", args)


def _defaultdict(args: tuple, pos: int) -> dict:
    # (default_factory[, items]); the factory is a Global that stays recorded in `globals`.
    if len(args) <= 1:
        return {}
    if len(args) == 2:
        return _pairs_to_dict("collections.defaultdict", args[1])
    raise _hook_error("collections.defaultdict", args)


def _iterable_items(what: str, args: tuple) -> list:
    if not args:
        return []
    if len(args) == 1 and type(args[0]) in (list, tuple, set, frozenset, dict):
        return list(args[0])
    raise _hook_error(what, args)


def _make_set(args: tuple, pos: int) -> set:
    out: set = set()
    for item in _iterable_items("set", args):
        _add_item(out, item)
    return out


def _make_frozenset(args: tuple, pos: int) -> frozenset:
    return frozenset(_make_set(args, pos))


def _encode(what: str, text: Any, encoding: Any) -> bytes:
    codec = _SAFE_ENCODINGS.get(encoding.lower()) if type(encoding) is str else None
    if type(text) is not str or codec is None:
        raise _hook_error(what, (text, encoding))
    try:
        return text.encode(codec)
    except UnicodeEncodeError as exc:
        raise _Unmodelled(f"{what}: text cannot be encoded as {codec}: {exc.reason}") from None


def _make_bytes(args: tuple, pos: int) -> bytes:
    if not args:
        return b""
    if len(args) == 1 and type(args[0]) in (bytes, bytearray):
        return bytes(args[0])
    if len(args) == 2:
        return _encode("bytes", args[0], args[1])
    raise _hook_error("bytes", args)  # bytes(n) would allocate what the file merely claims


def _make_bytearray(args: tuple, pos: int) -> bytearray:
    return bytearray(_make_bytes(args, pos))


def _codecs_encode(args: tuple, pos: int) -> bytes:
    # Protocols 0-2 pickle bytes as _codecs.encode('<latin-1 text>', 'latin1').
    if len(args) == 1:
        return _encode("_codecs.encode", args[0], "utf-8")
    if len(args) == 2:
        return _encode("_codecs.encode", args[0], args[1])
    raise _hook_error("_codecs.encode", args)


CONTAINER_HOOKS: Mapping[tuple[str, str], Callable[[tuple, int], object]] = MappingProxyType({
    ("collections", "OrderedDict"): _ordered_dict,
    ("collections", "defaultdict"): _defaultdict,
    ("builtins", "set"): _make_set,
    ("__builtin__", "set"): _make_set,
    ("builtins", "frozenset"): _make_frozenset,
    ("__builtin__", "frozenset"): _make_frozenset,
    ("builtins", "bytes"): _make_bytes,
    ("__builtin__", "bytes"): _make_bytes,
    ("builtins", "bytearray"): _make_bytearray,
    ("__builtin__", "bytearray"): _make_bytearray,
    ("_codecs", "encode"): _codecs_encode,
})
"""Inert builders for containers that pickles build by calling a builtin. Pure data, no import.
Merge with your own: ``hooks={**CONTAINER_HOOKS, **mine}``. ``OrderedDict``/``defaultdict`` give
a plain dict (a later BUILD of their ``__dict__`` is recorded and ignored)."""


# ---------------------------------------------------------------------------------------------
# Hashing guard shared by the VM and the hooks.

class _HashGuard:
    """Bounds the work of hashing tuples during one run (dict keys, set items).

    Tuple hashes are not cached, and C recursion through nested tuples has no guard: a 1e6-deep
    tuple crashes the interpreter, a DAG of shared tuples costs 2**depth, and one big tuple
    used as a key again and again (through the memo) costs its size each time. Each tuple's
    depth and expanded size are computed once per run (iteratively), and every hash is charged
    to a budget for the run.
    """

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.known: dict[int, tuple[int, int, tuple]] = {}  # id -> (depth, size, the tuple)
        self.work = 0

    def charge(self, key: tuple) -> None:
        self.work += self.size_of(key)
        if self.work > _MAX_HASH_WORK:
            raise LimitExceeded("tuple hashing work", _MAX_HASH_WORK, self.work,
                                format="pickle")

    def size_of(self, key: tuple) -> int:
        known = self.known
        if id(key) in known:
            return known[id(key)][1]
        path = [(key, iter(key))]
        while path:
            node, children = path[-1]
            for child in children:
                if type(child) is tuple and id(child) not in known:
                    if len(path) >= self.max_depth:
                        raise LimitExceeded("nesting depth of a hashed tuple", self.max_depth,
                                            len(path) + 1, format="pickle")
                    path.append((child, iter(child)))
                    break
            else:
                path.pop()
                depth, size = 1, 1
                for child in node:
                    if type(child) is tuple:
                        child_depth, child_size, _ = known[id(child)]
                        depth = max(depth, child_depth + 1)
                        size += child_size
                    else:
                        size += 1
                if size > _MAX_HASH_WORK:
                    raise LimitExceeded("tuple hashing work", _MAX_HASH_WORK, size,
                                        format="pickle")
                known[id(node)] = (depth, size, node)   # keeps the tuple (and its id) alive
        return known[id(key)][1]


_ACTIVE = threading.local()     # .guard: the running VM's _HashGuard, for CONTAINER_HOOKS


def _charge_hash(key: tuple) -> None:
    guard = getattr(_ACTIVE, "guard", None)
    if guard is None:           # a hook called outside run()
        guard = _HashGuard(DEFAULT_LIMITS.max_depth)
    guard.charge(key)


def _set_key(d: dict, key: Any, value: Any) -> None:
    if type(key) is tuple:
        _charge_hash(key)
    try:
        d[key] = value
    except TypeError:
        d[UnhashableKey(key)] = value


def _add_item(s: set, item: Any) -> None:
    if type(item) is tuple:
        _charge_hash(item)
    try:
        s.add(item)
    except TypeError:
        s.add(UnhashableKey(item))
