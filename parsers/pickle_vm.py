"""A symbolic pickle VM: it runs protocols 0-5, builds inert objects and executes nothing.

Spec (what a pickle is, as CPython's C ``_pickle`` Unpickler reads it from a file):

- A pickle is a stream of opcodes. Each opcode is one byte, followed by an argument whose layout
  the opcode fixes (``pickletools.opcodes`` is the table; this module does not retype it). The
  stream MUST end with ``STOP``; bytes after ``STOP`` are not part of the pickle (``end`` says
  where it stopped, so a caller MAY look for a second pickle there).
- ``PROTO n`` MAY appear (protocol >= 2) and MUST name a protocol <= 5. ``FRAME n`` (protocol 4+)
  MUST be followed by at least ``n`` bytes. An opcode SHOULD NOT cross a frame's end: CPython's
  readers then disagree (``pickle.loads`` and peeking files read on; ``io.BytesIO``, which
  torch.load uses for a zip's data.pkl, drops the rest of the frame and reads the argument from
  after it; counted bytes payloads are read on by all). The VM reads on and records each such
  place in ``reader_disagreements``; a FRAME that fits inside the open frame changes nothing.
- Text arguments are parsed as C strings: up to the first NUL (``I1\x00junk`` is 1).
- ``MARK`` pushes a mark; opcodes that take "items since the mark" MUST find one ("could not find
  MARK"). Items below the newest mark are out of reach ("unexpected MARK found"); an empty stack
  is "unpickling stack underflow". ``POP`` on a mark pops the mark.
- The memo maps integers to objects. ``PUT``/``BINPUT``/``LONG_BINPUT`` store the stack top at an
  index, ``MEMOIZE`` at ``len(memo)``; a ``GET`` of a missing index is an error.
- ``GLOBAL`` names are UTF-8 (``INST`` names ASCII); ``STACK_GLOBAL`` takes two ``str`` from the
  stack. ``REDUCE``/``NEWOBJ``/``NEWOBJ_EX``/``INST``/``OBJ`` call something; ``BUILD`` calls
  ``__setstate__`` or sets attributes; ``APPEND(S)``/``SETITEM(S)``/``ADDITEMS`` call methods of
  whatever is below the items. Every one of these is a place where a real loader runs code.
- Text (protocol 0/1) forms: ``INT`` is C ``strtol`` base 0 (``I01``/``I00`` are bools), ``LONG``
  MAY end in ``L``, ``STRING`` is quoted and backslash-escaped, ``UNICODE`` is raw-unicode-escape.
  Binary strings are UTF-8 with ``surrogatepass``.

What the VM does instead of executing:

- ``GLOBAL`` and friends push a `Global` (module, name, pos) and record a `GlobalSeen`.
- A call pushes a `Call` (func, args, kwargs, pos, opcode) and records a `CallSeen`, unless the
  callee is a `Global` named in ``hooks``: then ``hook(args, pos)`` builds the value (this is how
  the torch parser turns ``torch._utils._rebuild_tensor_v2`` into a tensor record, and how
  `CONTAINER_HOOKS` rebuild ``OrderedDict``/``set``/``bytes``). The call is still recorded.
- A value only known when a loader runs (a `Global`, a `Call`, a `PersistentRef`, an
  `Extension`) never fails a type check: as REDUCE/NEWOBJ arguments it is kept as a 1-tuple, as
  a STACK_GLOBAL operand it is recorded as `DYNAMIC`. Container hooks that cannot model their
  arguments give the inert `Call` (the run goes on, as a loader whose call succeeded would).
- Container opcodes fill real lists/dicts/sets; onto a `Call` they fill ``items``/``dictitems``/
  ``setitems``; onto anything else (a `Global`, a `PersistentRef` ...) they are method calls of a
  real object and are recorded as a `CallSeen` named after the opcode.
- ``PERSID``/``BINPERSID`` call ``persistent_load(pid, pos)`` or push a `PersistentRef`.
- ``build_hooks`` model unpicklers that override BUILD: joblib's ``NumpyUnpickler`` reads an
  array's raw bytes from the stream right after the BUILD of a ``NumpyArrayWrapper`` and goes on
  with the next opcode there. After a BUILD onto a `Call` of a hooked `Global`, ``hook(obj, end,
  nested)`` MAY return ``(value, next)``: ``value`` replaces the object on the stack and the run
  continues at ``next`` (``end <= next <= len(data)``, else a `PickleError`). ``nested(at)`` runs
  a fresh pickle at ``at`` (own stack and memo, same hooks: joblib's object arrays are a whole
  pickle inline) and merges its globals, calls and persistent ids into this run's result. BUILD
  is not inlined, so runs without build hooks pay nothing for this.
- Unhashable dict keys and set items are wrapped in `UnhashableKey`, so dicts still build.

Safety: no recursion (1e6-deep nesting works or fails with `LimitExceeded`), O(1) work per opcode
apart from the items it consumes, no allocation sized from a length field before that length is
checked against the bytes that remain, and every failure is a `PickleError` (or `LimitExceeded`)
that names the file, member, absolute byte offset and opcode. The result keeps what was seen
before the failure: a loader runs every opcode before a broken one.

Layout: this module is the VM (opcode table, the loop, `run`); the inert values and the result are
in `pickle_values`, the container hooks and hashing guard in `pickle_hooks`, the protocol-0/1 text
forms in `pickle_text`, the torch tensor pattern in `pickle_torchpath`. The public API below is
imported from here.

Public API: `run`, `Limits`, `DEFAULT_LIMITS`, `PickleResult`, `GlobalSeen`, `CallSeen`, `Global`,
`Call`, `PersistentRef`, `OutOfBandBuffer`, `Extension`, `UnhashableKey`, `BuildStates`, `NOTSET`,
`DECLINE`, `CONTAINER_HOOKS`, `PickleError`, `MAX_NESTED_RUNS`, `NotRecorded`.

Example:
    >>> import pickle
    >>> r = run(pickle.dumps({"a": [1, 2.5, None]}, protocol=2))
    >>> r.value, r.stopped, r.protocol
    ({'a': [1, 2.5, None]}, True, 2)
    >>> r = run(b"cos\\nsystem\\n(S'echo hi'\\ntR.")
    >>> r.globals[0].dotted, r.calls[0].args, r.value
    ('os.system', ('echo hi',), Call(os.system, 1 args))
"""
from __future__ import annotations

import codecs
import gc
import pickletools
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any

from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.native import optional_extension
from tensorscope.parsers.pickle_hooks import (
    _ACTIVE, CONTAINER_HOOKS, _add_item, _HashGuard, _ordered_dict, _set_key, _Unmodelled,
)
from tensorscope.parsers.pickle_text import (
    _py2_string, _py_int, _text_float, _text_index, _text_int,
)
from tensorscope.parsers.pickle_torchpath import (
    _SMALL_TUPLES, _TORCH_TENSOR, _puts_in_order, _small_int, _small_tuple,
)
# The values are part of this module's public API (`__all__` below): callers import them from here.
from tensorscope.parsers.pickle_values import (
    _INERT_DATA, _SYMBOLIC, DECLINE, DEFAULT_LIMITS, DYNAMIC, NOTSET, BuildStates, Call, CallSeen,
    EvidenceNotKept, Extension, Global, GlobalSeen, Limits, NotRecorded, OutOfBandBuffer,
    PersistentRef, PickleError, PickleResult, UnhashableKey,
)

__all__ = [
    "run", "Limits", "DEFAULT_LIMITS", "PickleResult", "GlobalSeen", "CallSeen", "Global", "Call",
    "PersistentRef", "OutOfBandBuffer", "Extension", "UnhashableKey", "BuildStates", "NOTSET",
    "DECLINE", "CONTAINER_HOOKS", "PickleError", "HIGHEST_PROTOCOL", "MAX_NESTED_RUNS",
    "DYNAMIC", "NotRecorded", "EvidenceNotKept",
]

HIGHEST_PROTOCOL = 5

# ---------------------------------------------------------------------------------------------
# Opcode table: reused from pickletools, never retyped.

_NAME: dict[int, str] = {}          # opcode byte -> name
_CODE: dict[str, int] = {}          # name -> opcode byte
_ARG_SIZE: dict[int, int] = {}      # opcode byte -> size of its fixed argument or length prefix
_PREFIX = {pickletools.TAKEN_FROM_ARGUMENT1: 1, pickletools.TAKEN_FROM_ARGUMENT4: 4,
           pickletools.TAKEN_FROM_ARGUMENT4U: 4, pickletools.TAKEN_FROM_ARGUMENT8U: 8}
for _info in pickletools.opcodes:
    _byte = ord(_info.code)
    if _byte in _NAME:
        raise ImportError(f"pickletools lists opcode {_byte:#04x} twice")
    _NAME[_byte] = _info.name
    _CODE[_info.name] = _byte
    if _info.arg is None:
        _ARG_SIZE[_byte] = 0
    elif _info.arg.n >= 0:
        _ARG_SIZE[_byte] = _info.arg.n
    else:   # a length prefix (TAKEN_FROM_ARGUMENT*) or a text line (UP_TO_NEWLINE: 0)
        _ARG_SIZE[_byte] = _PREFIX.get(_info.arg.n, 0)

# How far each opcode's argument reaches (for FRAME crossings): ("fixed", n), ("lines", count),
# ("counted", size of the little-endian length prefix) or ("signed", 4) for LONG4/BINSTRING.
_ARG_KIND: dict[int, tuple[str, int]] = {}
for _info in pickletools.opcodes:
    _byte = ord(_info.code)
    if _info.arg is None or _info.arg.n >= 0:
        _ARG_KIND[_byte] = ("fixed", 0 if _info.arg is None else _info.arg.n)
    elif _info.arg.n == pickletools.UP_TO_NEWLINE:
        _ARG_KIND[_byte] = ("lines", 2 if _info.arg.name.endswith("_pair") else 1)
    elif _info.arg.n == pickletools.TAKEN_FROM_ARGUMENT4:
        _ARG_KIND[_byte] = ("signed", 4)
    else:
        _ARG_KIND[_byte] = ("counted", _PREFIX[_info.arg.n])
# Opcodes whose payload the C unpickler reads with _Unpickler_ReadInto: the rest of the frame's
# buffer, then the file, contiguous for every reader (only their length prefix must fit).
_READ_INTO = frozenset(_CODE[name] for name in ("SHORT_BINBYTES", "BINBYTES", "BINBYTES8",
                                                 "BYTEARRAY8"))

# Binary layouts of opcode arguments (all little-endian except BINFLOAT, as pickle defines).
_U16 = struct.Struct("<H")    # BININT2, EXT2
_I32 = struct.Struct("<i")    # BININT, BINSTRING, LONG4, EXT4 (signed)
_U32 = struct.Struct("<I")    # BINUNICODE, BINBYTES, LONG_BINGET, LONG_BINPUT
_U64 = struct.Struct("<Q")    # FRAME, BINUNICODE8, BINBYTES8, BYTEARRAY8
_F64 = struct.Struct(">d")    # BINFLOAT is big-endian

# Limits on stack, memo and object counts are checked every _CHECK_EVERY opcodes and at STOP,
# so they may be overshot by at most that many entries; the opcode limit is exact.
_CHECK_EVERY = 4096
# Pickles run inside pickles through build hooks (`nested`), at most this deep: each level is a
# Python call, and a hostile file could nest one per few bytes.
MAX_NESTED_RUNS = 32


def _type_name(obj: Any) -> str:
    return type(obj).__name__


class _CallerFault(Exception):
    """Internal: a hook or persistent_load raised something other than FormatError."""


# ---------------------------------------------------------------------------------------------
# The VM.

# Opcodes handled inline in `_VM.execute` (the hot ones; the if-chain there is ordered by their
# frequency in torch pickles of protocols 2 and 4); every other opcode has an `op_<NAME>`
# method. Checked against pickletools at import time.
_INLINE = ("BININT1", "LONG_BINPUT", "BINGET", "BINPUT", "MARK", "BINUNICODE", "TUPLE",
           "TUPLE2", "EMPTY_TUPLE", "NEWFALSE", "MEMOIZE", "SHORT_BINUNICODE", "TUPLE1",
           "TUPLE3", "LONG_BINGET", "BININT", "BININT2", "NONE", "NEWTRUE", "EMPTY_DICT",
           "EMPTY_LIST", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "BINFLOAT", "STOP",
           "REDUCE", "BINPERSID")


# The fixed opcode sequence torch.save writes for one dense tensor, from the MARK after the
_FAST_TORCH = True      # tests turn it off to compare with the opcode-by-opcode run
# The same step compiled (tensorscope/_torchstep.c), bound at the end of this module; None when
# it is not built (or is a stale build): `torch_tensor` then runs. Tests set it to None too.
TORCHSTEP_ABI = 1
_STEP = optional_extension("_torchstep", TORCHSTEP_ABI)


class _VM:
    """State of one run. `execute` holds the hot loop; ``op_*`` methods take the opcode's
    offset and return the offset of the next opcode."""

    def __init__(self, data, start, persistent_load, hooks, limits, file, member, base_offset,
                 build_hooks=None, depth=0):
        if isinstance(data, bytes):
            self.data = data
            self.raw = data
        else:
            view = memoryview(data)
            if view.ndim != 1 or view.format != "B":
                view = view.cast("B")
            self.data = view
            self.raw = None     # no bytes.find on a memoryview: see _readline
        self.n = len(self.data)
        # FRAME: while one is open, `data`/`n` end at its end (a memoryview slice), so that an
        # opcode running past it fails, and `frame_retry` tells a crossing from a real failure.
        self.full = self.data
        self.full_n = self.n
        self.frame_end: int | None = None
        self.full_view: memoryview | None = None
        if not 0 <= start <= self.n:
            raise ValueError(f"start={start} is outside the data (0..{self.n})")
        self.start = start
        self.persistent_load = persistent_load
        self.hooks = hooks or {}
        self.build_hooks = build_hooks or None
        self.depth = depth      # nesting level of this run (build hooks' nested pickles)
        self.limits = limits
        self.file = file
        self.member = member
        self.base = base_offset
        self.stack: list = []
        self.metastack: list[list] = []
        # The memo: a list while the indices arrive in order (0, 1, 2 ... as every pickler
        # writes them): 8 bytes an entry instead of a dict slot and an int key (a 100,000-tensor
        # torch pickle puts 800,000 entries: ~17 MB less peak RSS). A dict from the first index
        # out of order (`memo_put`).
        self.memo: list | dict = []
        self.objects = 0        # containers and calls built by op_* methods
        self.buffers = 0
        self.hash_guard = _HashGuard(limits.max_depth)
        self.result = PickleResult()
        self.recording = True   # False: calls and persistent ids are NotRecorded (see `run`)
        # What the compiled torch step may do in place of persistent_load (see
        # `torch_zip.make_storage_resolver`): None unless the loader declares it.
        self.torch_fast = getattr(persistent_load, "torch_fast", None)

    # -- errors --------------------------------------------------------------------------------

    def error(self, reason: str, pos: int) -> PickleError:
        err = PickleError(reason, file=self.file, member=self.member, offset=self.base + pos)
        err._pickle_vm_placed = True
        return err

    def limit(self, resource: str, limit: int, actual: int, pos: int) -> LimitExceeded:
        err = LimitExceeded(resource, limit, actual, format="pickle", file=self.file,
                            member=self.member, offset=self.base + pos)
        err._pickle_vm_placed = True
        return err

    def locate(self, err: FormatError, pos: int) -> FormatError:
        """Place an error raised by a hook, persistent_load or helper. Its offset, if any, is
        relative to ``data`` (hooks get relative positions); without one it is the opcode's."""
        if not getattr(err, "_pickle_vm_placed", False):
            err.offset = self.base + (pos if err.offset is None else err.offset)
            err._pickle_vm_placed = True
        if not err.format:
            err.format = "pickle"
        if err.file is None:
            err.file = self.file
        if err.member is None:
            err.member = self.member
        err.args = (err._render(),)
        return err

    def short(self, name: str, want: int, pos: int, at: int) -> PickleError:
        """A length that runs past the data, or past max_string."""
        remain = self.n - at
        if want > remain:
            return self.error(f"{name} wants {want} bytes, {remain} remain", pos)
        return self.limit(f"{name} length", self.limits.max_string, want, pos)

    def underflow(self, name: str, pos: int) -> PickleError:
        if self.metastack:
            return self.error(f"{name}: unexpected MARK found", pos)
        return self.error(f"{name}: unpickling stack underflow", pos)

    def no_mark(self, name: str, pos: int) -> PickleError:
        return self.error(f"{name}: could not find MARK", pos)

    # -- the loop ------------------------------------------------------------------------------

    def execute(self) -> PickleResult:
        """Run the opcodes from ``start`` to STOP (or the first failure) and return the result.

        One function on purpose, the one place of this package where that is so: the hot opcodes
        are an if-chain inline here, over locals bound once at the top (stack, memo, the opcode
        bytes, bound methods), because each opcode then costs a local load and a compare instead of
        a method call with its frame and attribute lookups -- the dispatch is most of a pickle's
        run time (benchmarks/bench_pickle_vm.py). Split into functions, every opcode would pay a
        frame. The rarer opcodes are ``op_*`` methods reached through ``_SLOW_TABLE``; the values,
        container hooks, text forms and the torch pattern it uses live in their own modules.
        """
        result = self.result
        data = self.data
        raw = self.raw
        n = self.n
        pos = self.start
        stack = self.stack
        metastack = self.metastack
        memo = self.memo
        slow = _SLOW_TABLE
        calls = result.calls
        persistent_ids = result.persistent_ids
        persistent_load = self.persistent_load
        unpack_u16 = _U16.unpack_from
        unpack_i32 = _I32.unpack_from
        unpack_u32 = _U32.unpack_from
        unpack_f64 = _F64.unpack_from
        max_depth = self.limits.max_depth
        max_string = self.limits.max_string
        max_opcodes = self.limits.max_opcodes
        nops = 0        # opcodes dispatched by the loop
        extra = 0       # ... and run inside torch_tensor steps, beyond the one dispatched
        torch_seq = _TORCH_TENSOR.match if _FAST_TORCH else None
        step = _STEP.tensor if _FAST_TORCH and _STEP is not None else None
        torch_fast = self.torch_fast
        recording = self.recording
        resume = False
        built = 0       # containers built inline (op_* methods count into self.objects)
        op = -1
        value = None

        # Opcode bytes, from pickletools by name, as locals (as fast as literals in the chain).
        BININT1 = _CODE["BININT1"]; LONG_BINPUT = _CODE["LONG_BINPUT"]; BINGET = _CODE["BINGET"]
        BINPUT = _CODE["BINPUT"]; MARK = _CODE["MARK"]; BINUNICODE = _CODE["BINUNICODE"]
        TUPLE = _CODE["TUPLE"]; TUPLE2 = _CODE["TUPLE2"]; EMPTY_TUPLE = _CODE["EMPTY_TUPLE"]
        NEWFALSE = _CODE["NEWFALSE"]; MEMOIZE = _CODE["MEMOIZE"]
        SHORT_BINUNICODE = _CODE["SHORT_BINUNICODE"]; TUPLE1 = _CODE["TUPLE1"]
        TUPLE3 = _CODE["TUPLE3"]; LONG_BINGET = _CODE["LONG_BINGET"]; BININT = _CODE["BININT"]
        BININT2 = _CODE["BININT2"]; NONE = _CODE["NONE"]; NEWTRUE = _CODE["NEWTRUE"]
        EMPTY_DICT = _CODE["EMPTY_DICT"]; EMPTY_LIST = _CODE["EMPTY_LIST"]
        APPEND = _CODE["APPEND"]; APPENDS = _CODE["APPENDS"]; SETITEM = _CODE["SETITEM"]
        SETITEMS = _CODE["SETITEMS"]; BINFLOAT = _CODE["BINFLOAT"]; STOP = _CODE["STOP"]
        REDUCE = _CODE["REDUCE"]; BINPERSID = _CODE["BINPERSID"]

        while True:     # runs again only when frame_retry re-runs an opcode
            try:
                try:
                    while True:
                        # Opcodes run in batches that end where the limits are checked next;
                        # the `for` counts them, so the hot path pays no counter and no
                        # comparison for that. (`resume`: the compiled step ran several of the
                        # batch's dispatches; the batch goes on to the same end.)
                        if not resume:
                            batch_end = min(nops + _CHECK_EVERY, max_opcodes - extra)
                        resume = False
                        for nops in range(nops + 1, batch_end + 1):
                            op = data[pos]
                            # Every branch leaves `pos` at the opcode until nothing can fail any
                            # more, so the except clauses below know where the failure was.
                            if op == BININT1:
                                stack.append(data[pos + 1])
                                pos += 2
                            elif op == BINGET:
                                stack.append(memo[data[pos + 1]])
                                pos += 2
                            elif op == LONG_BINPUT:
                                top = stack[-1]
                                index = unpack_u32(data, pos + 1)[0]
                                if index == len(memo) and type(memo) is list:
                                    memo.append(top)
                                else:
                                    memo = self.memo_put(index, top)
                                pos += 5
                            elif op == MEMOIZE:
                                top = stack[-1]
                                if type(memo) is list:
                                    memo.append(top)
                                else:
                                    memo[len(memo)] = top
                                pos += 1
                            elif op == MARK:
                                if torch_seq is not None and pos + 1 < n and \
                                        data[pos + 1] == MARK:
                                    try:   # within the opcode limit, counted exactly
                                        if step is not None:
                                            done = step(data, pos, n, stack, memo,
                                                        max_depth - len(metastack),
                                                        max_opcodes - batch_end - extra + 1,
                                                        batch_end - nops + 1, max_string, self,
                                                        torch_fast, recording, persistent_ids)
                                        elif (match := torch_seq(data, pos, n)) is not None:
                                            done = self.torch_tensor(
                                                match, max_opcodes - batch_end - extra + 1)
                                        else:
                                            done = None
                                    except BaseException:
                                        pos, ran = self.fast_at
                                        extra += ran - 1
                                        raise
                                    if done is not None:
                                        pos = done[0]
                                        built += done[2]
                                        if len(done) == 3:      # the Python step: one tensor
                                            extra += done[1] - 1
                                            continue
                                        # the compiled step: done[3] of the loop's dispatches
                                        # (tensors and the opcodes between them)
                                        extra += done[1] - done[3]
                                        if done[3] == 1:
                                            continue
                                        nops += done[3] - 1
                                        resume = True
                                        break
                                if len(metastack) >= max_depth:
                                    raise self.limit("MARK nesting depth", max_depth,
                                                     len(metastack) + 1, pos)
                                metastack.append(stack)
                                stack = self.stack = []
                                pos += 1
                            elif op == TUPLE:
                                if not metastack:
                                    raise self.no_mark("TUPLE", pos)
                                items = tuple(stack)
                                stack = self.stack = metastack.pop()
                                stack.append(items)
                                built += 1
                                pos += 1
                            elif op == TUPLE2:
                                second = stack.pop()
                                stack[-1] = (stack[-1], second)
                                built += 1
                                pos += 1
                            elif op == REDUCE:
                                # `reduce_global` written inline (the hot opcode of a torch
                                # pickle): keep the two in step
                                args = stack[-1]
                                func = stack[-2]
                                if type(func) is not Global or type(args) is not tuple:
                                    pos = self.reduce_checked(pos)  # errors, calls of calls ...
                                    continue
                                calls.append(CallSeen(func, args, None, pos, "REDUCE"))
                                built += 1
                                del stack[-1]
                                hook = func._hook
                                if hook is None:
                                    stack[-1] = Call(func, args, None, pos, "REDUCE")
                                else:
                                    try:
                                        value = hook(args, pos)
                                    except _Unmodelled:
                                        value = DECLINE
                                    except FormatError:
                                        raise
                                    except Exception as exc:
                                        raise _CallerFault(f"hook for {func.dotted}") from exc
                                    if value is DECLINE:
                                        value = Call(func, args, None, pos, "REDUCE")
                                    stack[-1] = value
                                pos += 1
                            elif op == BINUNICODE:
                                size = unpack_u32(data, pos + 1)[0]
                                end = pos + 5 + size
                                if end > n or size > max_string:
                                    raise self.short("BINUNICODE", size, pos, pos + 5)
                                if raw is None:
                                    stack.append(str(data[pos + 5:end], "utf-8", "surrogatepass"))
                                else:   # bytes.decode is ~40 ns faster than str(memoryview, ...)
                                    stack.append(raw[pos + 5:end].decode("utf-8", "surrogatepass"))
                                pos = end
                            elif op == SHORT_BINUNICODE:
                                size = data[pos + 1]
                                end = pos + 2 + size
                                if end > n:
                                    raise self.short("SHORT_BINUNICODE", size, pos, pos + 2)
                                if raw is None:
                                    stack.append(str(data[pos + 2:end], "utf-8", "surrogatepass"))
                                else:
                                    stack.append(raw[pos + 2:end].decode("utf-8", "surrogatepass"))
                                pos = end
                            elif op == EMPTY_TUPLE:
                                stack.append(())
                                pos += 1
                            elif op == BINPERSID:
                                pid = stack[-1]
                                persistent_ids.append((pid, pos))
                                if persistent_load is None:
                                    stack[-1] = PersistentRef(pid, pos)
                                else:
                                    try:
                                        stack[-1] = persistent_load(pid, pos)
                                    except FormatError:
                                        raise
                                    except Exception as exc:
                                        raise _CallerFault("persistent_load") from exc
                                pos += 1
                            elif op == NEWFALSE:
                                stack.append(False)
                                pos += 1
                            elif op == BINPUT:
                                top = stack[-1]
                                index = data[pos + 1]
                                if index == len(memo) and type(memo) is list:
                                    memo.append(top)
                                else:
                                    memo = self.memo_put(index, top)
                                pos += 2
                            elif op == TUPLE1:
                                stack[-1] = (stack[-1],)
                                built += 1
                                pos += 1
                            elif op == TUPLE3:
                                third = stack.pop()
                                second = stack.pop()
                                stack[-1] = (stack[-1], second, third)
                                built += 1
                                pos += 1
                            elif op == LONG_BINGET:
                                stack.append(memo[unpack_u32(data, pos + 1)[0]])
                                pos += 5
                            elif op == BININT:
                                stack.append(unpack_i32(data, pos + 1)[0])
                                pos += 5
                            elif op == BININT2:
                                stack.append(unpack_u16(data, pos + 1)[0])
                                pos += 3
                            elif op == NONE:
                                stack.append(None)
                                pos += 1
                            elif op == NEWTRUE:
                                stack.append(True)
                                pos += 1
                            elif op == EMPTY_DICT:
                                stack.append({})
                                built += 1
                                pos += 1
                            elif op == EMPTY_LIST:
                                stack.append([])
                                built += 1
                                pos += 1
                            elif op == APPEND:
                                target = stack[-2]
                                if type(target) is list:
                                    target.append(stack.pop())
                                else:
                                    self.append_to(target, [stack.pop()], "APPEND", pos)
                                pos += 1
                            elif op == APPENDS:
                                if not metastack:
                                    raise self.no_mark("APPENDS", pos)
                                items = stack
                                stack = self.stack = metastack.pop()
                                target = stack[-1]
                                if type(target) is list:
                                    target.extend(items)
                                elif items:     # C _pickle: no items after the mark, no call
                                    self.append_to(target, items, "APPENDS", pos)
                                pos += 1
                            elif op == SETITEM:
                                target = stack[-3]
                                if type(target) is dict and type(stack[-2]) is str:
                                    target[stack[-2]] = stack[-1]
                                else:
                                    self.setitems_on(target, stack[-2:], "SETITEM", pos)
                                del stack[-2:]
                                pos += 1
                            elif op == SETITEMS:
                                if not metastack:
                                    raise self.no_mark("SETITEMS", pos)
                                items = stack
                                stack = self.stack = metastack.pop()
                                target = stack[-1]
                                if items:       # C _pickle: no items after the mark, no call
                                    self.setitems_on(target, items, "SETITEMS", pos)
                                pos += 1
                            elif op == BINFLOAT:
                                stack.append(unpack_f64(data, pos + 1)[0])
                                pos += 9
                            elif op == STOP:
                                value = stack.pop()
                                pos += 1
                                result.stopped = True
                                if self.frame_end is not None and pos < self.frame_end:
                                    self.disagree(pos - 1, f"STOP with {self.frame_end - pos} "
                                                  "bytes left in its FRAME (a second load from "
                                                  f"the same io.BytesIO starts at "
                                                  f"{self.frame_end})")
                                break
                            else:
                                handler = slow[op]
                                if handler is None:
                                    raise self.error(f"unknown opcode {op:#04x}", pos)
                                pos = handler(self, pos)
                                stack = self.stack      # the handler may have popped a mark
                                memo = self.memo        # ... or made the memo a dict (PUT)
                                if self.data is not data:   # a FRAME opened, a build hook left it
                                    data = self.data
                                    n = self.n
                        else:
                            resume = False
                        if result.stopped:
                            break   # STOP
                        if resume and nops < batch_end:
                            continue
                        resume = False      # the batch ended: check the limits
                        if nops + extra >= max_opcodes:
                            raise self.limit("opcode count", max_opcodes, nops + extra + 1, pos)
                        self.checkpoint(built, pos)
                except (FormatError, IndexError, struct.error, KeyError, UnicodeDecodeError):
                    # Inside a FRAME the data ends at the frame's end: an opcode that failed may
                    # only have run past it (frame_retry decides); it is then run again on the
                    # whole data, as pickle.loads would.
                    if self.frame_end is None or not self.frame_retry(pos):
                        raise
                    data = self.data
                    n = self.n
                    stack = self.stack
                    nops -= 1
                    continue
            except FormatError as exc:
                result.error = self.locate(exc, pos)
            except (IndexError, struct.error):
                result.error = self.classify_index_error(op, pos)
                if op in (BINGET, LONG_BINGET) and pos + 1 + _ARG_SIZE[op] <= self.n:
                    # the argument is all there: a list memo has no such index
                    index = data[pos + 1] if op == BINGET else unpack_u32(data, pos + 1)[0]
                    result.error = self.error(
                        f"{_NAME[op]}: memo value not found at index {index}", pos)
            except KeyError as exc:
                if op not in (BINGET, LONG_BINGET):
                    raise
                result.error = self.error(
                    f"{_NAME[op]}: memo value not found at index {exc.args[0]}", pos)
            except UnicodeDecodeError as exc:
                result.error = self.error(f"{_NAME[op]}: invalid UTF-8 at byte {exc.start} of the "
                                          f"string ({exc.reason})", pos)
            except RecursionError:
                result.error = self.error(f"{_NAME[op]}: objects nested too deeply to compare", pos)
            except _CallerFault as exc:
                cause = exc.__cause__
                result.error = self.error(f"{exc.args[0]} raised {type(cause).__name__}: {cause}",
                                          pos)
                result.error.__cause__ = cause
            break
        if pos >= n and not result.stopped:
            nops -= 1       # the batch loop counted the opcode that was not there
        result.opcodes = nops + extra
        result.end = pos
        if result.error is None:
            try:
                self.checkpoint(built, pos - 1)
            except LimitExceeded as exc:
                result.error = exc
                return result
            result.value = value
        return result

    def checkpoint(self, built: int, pos: int) -> None:
        """Check the stack, memo and object limits (the opcode limit is the batch loop's)."""
        lim = self.limits
        depth_items = len(self.stack) + sum(map(len, self.metastack))
        if depth_items > lim.max_stack:
            raise self.limit("stack size", lim.max_stack, depth_items, pos)
        if len(self.memo) > lim.max_memo:
            raise self.limit("memo size", lim.max_memo, len(self.memo), pos)
        objects = built + self.objects
        if objects > lim.max_objects:
            raise self.limit("object count", lim.max_objects, objects, pos)

    def classify_index_error(self, op: int, pos: int) -> PickleError:
        """An IndexError/struct.error in the loop: the data ended, an argument was cut short, or
        the stack was too short for the opcode."""
        if pos >= self.n:
            if pos == self.start:
                return self.error("no opcode: the pickle is empty", pos)
            return self.error("ran out of data before STOP", pos)
        name = _NAME[op]
        size = _ARG_SIZE.get(op, 0)
        if pos + 1 + size > self.n:
            return self.error(f"{name} wants {size} bytes, {self.n - pos - 1} remain", pos)
        return self.underflow(name, pos)

    # -- torch's tensor sequence as one step ---------------------------------------------------

    def torch_tensor(self, m: re.Match, budget: int) -> tuple[int, int, int] | None:
        """Run a `_TORCH_TENSOR` match (the stack top is the rebuild function): (next offset,
        opcodes run, objects built), or None, having changed nothing, when its opcodes would do
        anything but the plain thing or are more than ``budget``. On a failure (persistent_load
        or a hook raising) ``self.fast_at`` holds the failing opcode's offset and the count of
        opcodes run up to and including it."""
        (get_a, get_b, xlen, slen, key, put1, get_c, numel, put2, offset, size, put3, stride,
         put4, grad, get_d, put5, put6) = m.groups()
        memo, stack = self.memo, self.stack
        n = len(memo)
        if type(memo) is not list or not stack or type(stack[-1]) is not Global or \
                (xlen or slen)[0] != len(key) or \
                not _puts_in_order(n, b"".join((put1, put2, put3, put4, put5, put6))):
            return None
        ia = get_a[1] if len(get_a) == 2 else _U32.unpack_from(get_a, 1)[0]
        ib = get_b[1] if len(get_b) == 2 else _U32.unpack_from(get_b, 1)[0]
        ic = get_c[1] if len(get_c) == 2 else _U32.unpack_from(get_c, 1)[0]
        id_ = get_d[1] if len(get_d) == 2 else _U32.unpack_from(get_d, 1)[0]
        shape, ops_size = _SMALL_TUPLES.get(size) or _small_tuple(size)
        strides, ops_stride = _SMALL_TUPLES.get(stride) or _small_tuple(stride)
        ops = 22 + ops_size + ops_stride
        if ia >= n or ib >= n or ic >= n or id_ >= n or shape is None or strides is None or \
                ops > budget or type(memo[id_]) is not Global or \
                len(self.metastack) + 3 > self.limits.max_depth:
            return None
        # From here on, the opcodes' effects in their order.
        key = key.decode("ascii")
        pid = (memo[ia], memo[ib], key, memo[ic],
               numel[1] if numel[0] == 0x4b else _small_int(numel))    # BININT1 inline
        memo.append(key)
        memo.append(pid)
        at = m.end(9)                                   # BINPERSID
        self.fast_at = (at, 11)
        if self.recording:
            self.result.persistent_ids.append((pid, at))
        storage = self.load_storage(pid, at)
        memo.append(shape)
        memo.append(strides)
        at = m.end(16) + 1                              # REDUCE of the OrderedDict
        self.fast_at = (at, ops - 4)
        empty = self.reduce_global(memo[id_], (), at)
        memo.append(empty)
        args = (storage, offset[1] if offset[0] == 0x4b else _small_int(offset), shape, strides,
                grad == b"\x88", empty)
        memo.append(args)
        at = m.end() - 1                                # REDUCE of the rebuild function
        self.fast_at = (at, ops)
        stack[-1] = self.reduce_global(stack[-1], args, at)
        # objects built: the pid and argument tuples, the two calls, non-empty size and stride
        return m.end(), ops, 4 + (size[0] != 0x29) + (stride[0] != 0x29)

    def load_storage(self, pid: Any, pos: int) -> Any:
        """BINPERSID of `torch_tensor` (and of the compiled step, when its own case does not
        apply): persistent_load's value, or a `PersistentRef` without one."""
        load = self.persistent_load
        if load is None:
            return PersistentRef(pid, pos)
        try:
            return load(pid, pos)
        except FormatError:
            raise
        except Exception as exc:
            raise _CallerFault("persistent_load") from exc

    def reduce_global(self, func: Global, args: tuple, pos: int) -> Any:
        """REDUCE of a `Global` with an argument tuple, as `execute` runs it inline."""
        if self.recording:
            self.result.calls.append(CallSeen(func, args, None, pos, "REDUCE"))
        hook = func._hook
        if hook is None:
            return Call(func, args, None, pos, "REDUCE")
        try:
            value = hook(args, pos)
        except _Unmodelled:
            value = DECLINE
        except FormatError:
            raise
        except Exception as exc:
            raise _CallerFault(f"hook for {func.dotted}") from exc
        return Call(func, args, None, pos, "REDUCE") if value is DECLINE else value

    # -- shared steps --------------------------------------------------------------------------

    def take(self, what: str, size: int, pos: int, at: int) -> memoryview | bytes:
        """``size`` bytes at ``at`` after checking them against the data and max_string."""
        if size > self.n - at or size > self.limits.max_string:
            raise self.short(what, size, pos, at)
        return self.data[at:at + size]

    def readline(self, what: str, pos: int, at: int) -> tuple[bytes, int]:
        """The text up to the next newline (excluded) and the offset after it."""
        limit = min(self.n, at + self.limits.max_string + 1)
        if self.raw is not None:
            nl = self.raw.find(b"\n", at, limit)
        else:
            nl = -1
            chunk = at
            while chunk < limit:        # memoryview has no find(): search in bounded copies
                piece = bytes(self.data[chunk:min(limit, chunk + 65536)])
                i = piece.find(b"\n")
                if i >= 0:
                    nl = chunk + i
                    break
                chunk += len(piece)
        if nl < 0:
            if limit < self.n:
                raise self.limit(f"{what} line length", self.limits.max_string,
                                 self.limits.max_string + 1, pos)
            raise self.error(f"{what} wants a newline-terminated argument, the data ends first",
                             pos)
        return bytes(self.data[at:nl]), nl + 1

    def mark_items(self, name: str, pos: int) -> list:
        """Pop everything since the newest MARK, and the mark."""
        if not self.metastack:
            raise self.no_mark(name, pos)
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def pop(self, name: str, pos: int) -> Any:
        if not self.stack:
            raise self.underflow(name, pos)
        return self.stack.pop()

    def external(self, what: str, fn: Callable, *args) -> Any:
        """Call a hook or persistent_load: FormatError passes, anything else is a fault."""
        try:
            return fn(*args)
        except _Unmodelled:
            return DECLINE
        except FormatError:
            raise
        except Exception as exc:
            raise _CallerFault(what) from exc

    def record_global(self, module: str, name: str, pos: int, opcode: str) -> Global:
        self.result.globals.append(GlobalSeen(module, name, pos, opcode))
        ref = Global(module, name, pos)
        ref._hook = self.hooks.get((module, name))
        return ref

    def call(self, func: Any, args: tuple, kwargs: dict | None, pos: int, opcode: str) -> Any:
        """Record a call and return its inert value (a hook's value or a `Call`). REDUCE of a
        `Global` does the same inline in `execute`."""
        if type(func) in _INERT_DATA:
            raise self.error(f"{opcode}: {_type_name(func)!r} object is not callable", pos)
        self.result.calls.append(CallSeen(func, args, kwargs, pos, opcode))
        self.objects += 1
        if type(func) is Global and not kwargs:
            hook = self.hooks.get((func.module, func.name))     # also for Globals made by hand
            if hook is not None:
                value = self.external(f"hook for {func.dotted}", hook, args, pos)
                if value is not DECLINE:
                    return value
        return Call(func, args, kwargs, pos, opcode)

    def record_method(self, target: Any, args: tuple, opcode: str, pos: int) -> None:
        """A container opcode applied to an object the VM did not build as a container (a
        `Global`, a `PersistentRef`, a hook's value ...): a loader calls its methods."""
        self.result.calls.append(CallSeen(target, args, None, pos, opcode))

    def append_to(self, target: Any, items: list, opcode: str, pos: int) -> None:
        kind = type(target)
        if kind is list:
            target.extend(items)
        elif kind is Call:
            if target._items is None:
                target._items = []
            target._items.extend(items)
        elif kind is bytearray:
            try:
                target.extend(item for item in items if type(item) not in _SYMBOLIC)
            except (TypeError, ValueError):
                raise self.error(f"{opcode}: bytearray items must be ints in range(256)",
                                 pos) from None
        elif kind in _INERT_DATA:
            raise self.error(f"{opcode}: cannot append to {_type_name(target)!r}", pos)
        else:
            self.record_method(target, tuple(items), opcode, pos)

    def setitems_on(self, target: Any, items: list, opcode: str, pos: int) -> None:
        if len(items) % 2:
            raise self.error(f"odd number of items for {opcode}", pos)
        kind = type(target)
        if kind is dict:
            keys = items[::2]
            if tuple not in map(type, keys):
                try:
                    target.update(zip(keys, items[1::2]))
                    return
                except TypeError:
                    pass    # an unhashable key: redo one by one (same result, same order)
            for i in range(0, len(items), 2):
                _set_key(target, items[i], items[i + 1])
        elif kind is Call:
            if target._dictitems is None:
                target._dictitems = []
            target._dictitems.extend(zip(items[::2], items[1::2]))
        elif kind is list or kind is bytearray:
            for i in range(0, len(items), 2):   # __setitem__, as a loader would call it
                key, value = items[i], items[i + 1]
                if type(key) in _SYMBOLIC or kind is bytearray and type(value) in _SYMBOLIC:
                    continue    # an index or byte computed at load time: may well be valid
                if type(key) not in (int, bool) or not -len(target) <= key < len(target):
                    raise self.error(f"{opcode}: index {key!r} is not valid for a "
                                     f"{kind.__name__} of {len(target)} items", pos)
                if kind is bytearray and (type(value) not in (int, bool) or
                                          not 0 <= value < 256):
                    raise self.error(f"{opcode}: bytearray items must be ints in range(256)",
                                     pos)
                target[key] = value
        elif kind in _INERT_DATA:
            raise self.error(f"{opcode}: {_type_name(target)!r} does not support item "
                             "assignment", pos)
        else:
            self.record_method(target, tuple(zip(items[::2], items[1::2])), opcode, pos)

    def dict_from(self, items: list, name: str, pos: int) -> dict:
        d: dict = {}
        self.objects += 1
        if items:
            self.setitems_on(d, items, name, pos)
        return d

    def instantiate(self, cls: Any, args: tuple, opcode: str, pos: int) -> None:
        self.stack.append(self.call(cls, args, None, pos, opcode))

    # -- opcodes not inlined in execute() (each returns the next opcode's offset) --------------

    def op_PROTO(self, pos: int) -> int:
        proto = self.data[pos + 1]
        if proto > HIGHEST_PROTOCOL:
            raise self.error(f"unsupported pickle protocol: {proto}", pos)
        if self.result.protocol is None:
            self.result.protocol = proto
        return pos + 2

    def op_FRAME(self, pos: int) -> int:
        size = _U64.unpack_from(self.data, pos + 1)[0]
        remain = self.full_n - (pos + 9)
        if size > remain:
            raise self.error(f"FRAME wants {size} bytes, {remain} remain", pos)
        end = pos + 9 + size
        if self.frame_end is not None:
            if end <= self.frame_end:
                return pos + 9      # read from the open frame's buffer: that buffer still rules
            self.disagree(pos, f"FRAME inside a FRAME runs {end - self.frame_end} bytes past "
                          f"its end at {self.frame_end}")
        self.frame_end = end
        if self.full_view is None:
            self.full_view = memoryview(self.full)
        self.data = self.full_view[:end]
        self.n = end
        return pos + 9

    # -- frames --------------------------------------------------------------------------------

    def disagree(self, pos: int, what: str) -> None:
        self.result.reader_disagreements.append((pos, what))

    def leave_frame(self) -> None:
        self.frame_end = None
        self.data = self.full
        self.n = self.full_n

    def frame_retry(self, pos: int) -> bool:
        """An opcode at ``pos`` failed inside a FRAME. True (frame left, run it again) when it
        starts at the frame's end or runs past it; False when it fails within the frame."""
        end = self.frame_end
        if pos != end:
            if self.extent_end(pos) <= end or end >= self.full_n:
                return False    # fails whatever the reader: a real failure
            op = self.full[pos]
            if op not in _READ_INTO or pos + 1 + _ARG_KIND[op][1] > end:
                self.disagree(pos, f"{_NAME.get(op, 'opcode')} runs past the end of its FRAME "
                              f"at {end}: io.BytesIO readers (torch.load) read its argument "
                              f"from after the frame, pickle.loads reads on")
        self.leave_frame()
        return True

    def extent_end(self, pos: int) -> int:
        """Offset after the opcode at ``pos`` and its argument in the whole data
        (``full_n + 1`` when the data ends first)."""
        data, n = self.full, self.full_n
        kind, size = _ARG_KIND.get(data[pos], ("fixed", 0))
        at = pos + 1
        if kind == "fixed":
            at += size
        elif kind == "lines":
            text = self.raw if self.raw is not None else bytes(data)  # only on a failure
            for _ in range(size):
                nl = text.find(b"\n", at)
                if nl < 0:
                    return n + 1
                at = nl + 1
        else:
            if at + size > n:
                return n + 1
            length = int.from_bytes(bytes(data[at:at + size]), "little", signed=kind == "signed")
            at += size + max(length, 0)
        return at if at <= n else n + 1

    def op_POP(self, pos: int) -> int:
        if self.stack:
            self.stack.pop()
        elif self.metastack:        # the top "item" is a mark: POP removes it (load_pop)
            self.stack = self.metastack.pop()
        else:
            raise self.underflow("POP", pos)
        return pos + 1

    def op_POP_MARK(self, pos: int) -> int:
        self.mark_items("POP_MARK", pos)
        return pos + 1

    def op_DUP(self, pos: int) -> int:
        if not self.stack:
            raise self.underflow("DUP", pos)
        self.stack.append(self.stack[-1])
        return pos + 1

    def op_LIST(self, pos: int) -> int:
        items = self.mark_items("LIST", pos)
        self.stack.append(items)    # the popped slice is a fresh list already
        self.objects += 1
        return pos + 1

    def op_DICT(self, pos: int) -> int:
        items = self.mark_items("DICT", pos)
        if len(items) % 2:
            raise self.error("odd number of items for DICT", pos)
        self.stack.append(self.dict_from(items, "DICT", pos))
        return pos + 1

    def op_EMPTY_SET(self, pos: int) -> int:
        self.stack.append(set())
        self.objects += 1
        return pos + 1

    def op_ADDITEMS(self, pos: int) -> int:
        items = self.mark_items("ADDITEMS", pos)
        if not self.stack:
            raise self.underflow("ADDITEMS", pos)
        target = self.stack[-1]
        if not items:
            return pos + 1
        kind = type(target)
        if kind is set:
            for item in items:
                _add_item(target, item)
        elif kind is Call:
            if target._setitems is None:
                target._setitems = []
            target._setitems.extend(items)
        elif kind in _INERT_DATA:
            raise self.error(f"ADDITEMS: cannot add items to {_type_name(target)!r}", pos)
        else:
            self.record_method(target, tuple(items), "ADDITEMS", pos)
        return pos + 1

    def op_FROZENSET(self, pos: int) -> int:
        items = self.mark_items("FROZENSET", pos)
        out: set = set()
        for item in items:
            _add_item(out, item)
        self.stack.append(frozenset(out))
        self.objects += 1
        return pos + 1

    def op_INT(self, pos: int) -> int:
        text, nxt = self.readline("INT", pos, pos + 1)
        self.stack.append(_text_int(text))
        return nxt

    def op_LONG(self, pos: int) -> int:
        text, nxt = self.readline("LONG", pos, pos + 1)
        if text.endswith(b"L"):     # load_long overwrites a final 'L' with NUL
            text = text[:-1]
        self.stack.append(_py_int(text, "LONG"))
        return nxt

    def _long(self, name: str, size: int, pos: int, at: int) -> int:
        if size < 0:
            raise self.error(f"{name} has negative byte count {size}", pos)
        raw = self.take(name, size, pos, at)
        if size > self.limits.max_long:
            # CPython builds it whatever its size, and goes on: so do we, with an int of the
            # same sign from its low 8 bytes (its value never decides an import; a huge one
            # hashed again and again through the memo would cost O(size) each time).
            low = int.from_bytes(raw[:8], "little")
            self.stack.append(-low - 1 if raw[-1] & 0x80 else low)
        else:
            self.stack.append(int.from_bytes(raw, "little", signed=True))
        return at + size

    def op_LONG1(self, pos: int) -> int:
        return self._long("LONG1", self.data[pos + 1], pos, pos + 2)

    def op_LONG4(self, pos: int) -> int:
        return self._long("LONG4", _I32.unpack_from(self.data, pos + 1)[0], pos, pos + 5)

    def op_FLOAT(self, pos: int) -> int:
        text, nxt = self.readline("FLOAT", pos, pos + 1)
        self.stack.append(_text_float(text))
        return nxt

    def op_STRING(self, pos: int) -> int:
        text, nxt = self.readline("STRING", pos, pos + 1)
        if len(text) < 2 or text[0] != text[-1] or text[0] not in b"\"'":
            raise self.error("the STRING opcode argument must be quoted", pos)
        try:
            raw = codecs.escape_decode(text[1:-1])[0]   # data decoding, nothing runs
        except ValueError as exc:
            raise self.error(f"STRING: bad escape: {exc}", pos) from None
        self.stack.append(_py2_string(raw))
        return nxt

    def op_BINSTRING(self, pos: int) -> int:
        size = _I32.unpack_from(self.data, pos + 1)[0]
        if size < 0:
            raise self.error(f"BINSTRING has negative byte count {size}", pos)
        self.stack.append(_py2_string(bytes(self.take("BINSTRING", size, pos, pos + 5))))
        return pos + 5 + size

    def op_SHORT_BINSTRING(self, pos: int) -> int:
        size = self.data[pos + 1]
        self.stack.append(_py2_string(bytes(self.take("SHORT_BINSTRING", size, pos, pos + 2))))
        return pos + 2 + size

    def op_UNICODE(self, pos: int) -> int:
        text, nxt = self.readline("UNICODE", pos, pos + 1)
        try:
            self.stack.append(str(text, "raw-unicode-escape"))
        except UnicodeDecodeError as exc:
            raise self.error(f"UNICODE: bad raw-unicode-escape text ({exc.reason})", pos) from None
        return nxt

    def op_BINUNICODE8(self, pos: int) -> int:
        size = _U64.unpack_from(self.data, pos + 1)[0]
        raw = self.take("BINUNICODE8", size, pos, pos + 9)
        self.stack.append(str(raw, "utf-8", "surrogatepass"))
        return pos + 9 + size

    def op_BINBYTES(self, pos: int) -> int:
        size = _U32.unpack_from(self.data, pos + 1)[0]
        self.stack.append(bytes(self.take("BINBYTES", size, pos, pos + 5)))
        return pos + 5 + size

    def op_SHORT_BINBYTES(self, pos: int) -> int:
        size = self.data[pos + 1]
        self.stack.append(bytes(self.take("SHORT_BINBYTES", size, pos, pos + 2)))
        return pos + 2 + size

    def op_BINBYTES8(self, pos: int) -> int:
        size = _U64.unpack_from(self.data, pos + 1)[0]
        self.stack.append(bytes(self.take("BINBYTES8", size, pos, pos + 9)))
        return pos + 9 + size

    def op_BYTEARRAY8(self, pos: int) -> int:
        size = _U64.unpack_from(self.data, pos + 1)[0]
        self.stack.append(bytearray(self.take("BYTEARRAY8", size, pos, pos + 9)))
        self.objects += 1
        return pos + 9 + size

    def op_NEXT_BUFFER(self, pos: int) -> int:
        self.stack.append(OutOfBandBuffer(self.buffers, pos))
        self.buffers += 1
        return pos + 1

    def op_READONLY_BUFFER(self, pos: int) -> int:
        if not self.stack:
            raise self.underflow("READONLY_BUFFER", pos)
        top = self.stack[-1]
        if type(top) is OutOfBandBuffer:
            top.readonly = True
        elif type(top) is bytearray:
            self.stack[-1] = bytes(top)     # a read-only view of it, as data
        elif type(top) in _INERT_DATA and type(top) is not bytes:
            raise self.error(f"READONLY_BUFFER: {_type_name(top)!r} is not a buffer", pos)
        return pos + 1

    def op_GET(self, pos: int) -> int:
        text, nxt = self.readline("GET", pos, pos + 1)
        index = _text_index(text, "GET")
        memo = self.memo
        if not (0 <= index < len(memo) if type(memo) is list else index in memo):
            raise self.error(f"GET: memo value not found at index {index}", pos)
        self.stack.append(memo[index])
        return nxt

    def op_PUT(self, pos: int) -> int:
        text, nxt = self.readline("PUT", pos, pos + 1)
        if not self.stack:
            raise self.underflow("PUT", pos)
        index = _text_index(text, "PUT")
        if index < 0:
            raise self.error("negative PUT argument", pos)
        self.memo_put(index, self.stack[-1])
        return nxt

    def memo_put(self, index: int, value) -> list | dict:
        """``memo[index] = value`` for an index the list form cannot take in order (or any index
        once the memo is a dict); returns the memo (the loop's local follows it)."""
        memo = self.memo
        if type(memo) is list:
            if index < len(memo):
                memo[index] = value
                return memo
            if index == len(memo):
                memo.append(value)
                return memo
            memo = self.memo = dict(enumerate(memo))
        memo[index] = value
        return memo

    def _names(self, what: str, pos: int, encoding: str) -> tuple[str, str, int]:
        module, at = self.readline(what, pos, pos + 1)
        name, nxt = self.readline(what, pos, at)
        try:
            return module.decode(encoding), name.decode(encoding), nxt
        except UnicodeDecodeError:
            raise self.error(f"{what}: module or name {module[:80]!r}, {name[:80]!r} is not "
                             f"valid {encoding.upper()}", pos) from None

    def op_GLOBAL(self, pos: int) -> int:
        module, name, nxt = self._names("GLOBAL", pos, "utf-8")
        self.stack.append(self.record_global(module, name, pos, "GLOBAL"))
        return nxt

    def op_STACK_GLOBAL(self, pos: int) -> int:
        name = self.pop("STACK_GLOBAL", pos)
        module = self.pop("STACK_GLOBAL", pos)
        if type(name) is not str or type(module) is not str:
            # A name computed at load time (a call's result, a global such as os.name, a
            # persistent id) may be a str when the loader runs: it imports what we cannot
            # name. Recorded with DYNAMIC in place of the unknown part (judged CRITICAL).
            if (type(module) is str or type(module) in _SYMBOLIC) and \
                    (type(name) is str or type(name) in _SYMBOLIC):
                module = module if type(module) is str else DYNAMIC
                name = name if type(name) is str else DYNAMIC
            else:
                raise self.error(f"STACK_GLOBAL requires str, got {_type_name(module)} and "
                                 f"{_type_name(name)}", pos)
        self.stack.append(self.record_global(module, name, pos, "STACK_GLOBAL"))
        return pos + 1

    def op_INST(self, pos: int) -> int:
        if not self.metastack:      # load_inst looks for the mark before reading its lines
            raise self.no_mark("INST", pos)
        module, name, nxt = self._names("INST", pos, "ascii")
        args = tuple(self.mark_items("INST", pos))
        cls = self.record_global(module, name, pos, "INST")
        self.instantiate(cls, args, "INST", pos)
        return nxt

    def op_OBJ(self, pos: int) -> int:
        items = self.mark_items("OBJ", pos)
        if not items:
            raise self.underflow("OBJ", pos)
        cls = items[0]
        if type(cls) is Global:
            self.result.globals.append(GlobalSeen(cls.module, cls.name, pos, "OBJ"))
        self.instantiate(cls, tuple(items[1:]), "OBJ", pos)
        return pos + 1

    def reduce_checked(self, pos: int) -> int:
        """REDUCE when the callee is not a plain `Global` or the arguments not a tuple (the
        common case is inline in `execute`)."""
        args = self.stack.pop()
        func = self.stack[-1]
        if type(args) in _SYMBOLIC:
            args = (args,)      # an argument tuple computed at load time: kept, opaque
        elif type(args) is not tuple:
            raise self.error(f"REDUCE argument list must be a tuple, not {_type_name(args)}",
                             pos)
        self.stack[-1] = self.call(func, args, None, pos, "REDUCE")
        return pos + 1

    def op_NEWOBJ(self, pos: int) -> int:
        if len(self.stack) < 2:
            raise self.underflow("NEWOBJ", pos)
        args = self.stack.pop()
        cls = self.stack[-1]
        if type(args) in _SYMBOLIC:
            args = (args,)      # computed at load time: kept, opaque
        elif type(args) is not tuple:
            raise self.error(f"NEWOBJ expected an arg tuple, got {_type_name(args)}", pos)
        if type(cls) in _INERT_DATA:
            raise self.error(f"NEWOBJ class argument isn't a type object: "
                             f"{_type_name(cls)}", pos)
        self.stack[-1] = self.call(cls, args, None, pos, "NEWOBJ")
        return pos + 1

    def op_NEWOBJ_EX(self, pos: int) -> int:
        if len(self.stack) < 3:
            raise self.underflow("NEWOBJ_EX", pos)
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack[-1]
        if type(args) in _SYMBOLIC:
            args = (args,)      # computed at load time: kept, opaque
        if type(kwargs) in _SYMBOLIC:
            kwargs = {DYNAMIC: kwargs}
        if type(args) is not tuple:
            raise self.error(f"NEWOBJ_EX args argument must be a tuple, not "
                             f"{_type_name(args)}", pos)
        if type(kwargs) is not dict:
            raise self.error(f"NEWOBJ_EX kwargs argument must be a dict, not "
                             f"{_type_name(kwargs)}", pos)
        if type(cls) in _INERT_DATA:
            raise self.error(f"NEWOBJ_EX class argument isn't a type object: "
                             f"{_type_name(cls)}", pos)
        self.stack[-1] = self.call(cls, args, kwargs, pos, "NEWOBJ_EX")
        return pos + 1

    def op_BUILD(self, pos: int) -> int:
        if len(self.stack) < 2:
            raise self.underflow("BUILD", pos)
        state = self.stack.pop()
        target = self.stack[-1]
        self.result.calls.append(CallSeen(target, (state,), None, pos, "BUILD"))
        if type(target) is Call:
            old = target.state
            if old is NOTSET:
                target.state = state
            elif type(old) is dict and type(state) is dict:
                if not target._owns_state:      # never mutate a dict other objects may share
                    target.state = old = dict(old)
                    target._owns_state = True
                old.update(state)
            elif type(old) is BuildStates and target._owns_state:
                old.append(state)
            else:
                target.state = BuildStates([old, state])
                target._owns_state = True
            if self.build_hooks is not None and type(target.func) is Global:
                hook = self.build_hooks.get((target.func.module, target.func.name))
                if hook is not None:
                    return self.after_build(hook, target, pos)
        # Any other target: recorded above and otherwise ignored (inert data has no __dict__).
        return pos + 1

    def after_build(self, hook: Callable, target: Call, pos: int) -> int:
        """Run a build hook (see the module docstring); returns the next opcode's offset."""
        end = pos + 1
        out = self.external(f"build hook for {target.func.dotted}", hook, target, end,
                            self.nested)
        if out is None:
            return end
        value, nxt = out
        if type(nxt) is not int or not end <= nxt <= self.full_n:
            raise self.error(f"BUILD of {target.func.dotted}: the data after it ends at "
                             f"{nxt!r}, outside {end}..{self.full_n}", pos)
        self.stack[-1] = value
        if nxt != end and self.frame_end is not None:
            self.leave_frame()  # the hook read raw bytes from the file, not from the frame
        return nxt

    def nested(self, at: int) -> PickleResult:
        """Run a fresh pickle at ``at`` (same data, hooks and limits) for a build hook; merge
        what it saw into this run. Raises its error (the outer run fails there)."""
        if self.depth >= MAX_NESTED_RUNS:
            raise self.limit("nested pickle depth", MAX_NESTED_RUNS, self.depth + 1, at)
        if not 0 <= at <= self.full_n:
            raise self.error(f"nested pickle at {at} is outside the data (0..{self.full_n})", at)
        vm = _VM(self.full, at, self.persistent_load, self.hooks, self.limits, self.file,
                 self.member, self.base, self.build_hooks, self.depth + 1)
        vm.hash_guard = self.hash_guard
        inner = vm.execute()
        outer = self.result
        outer.globals.extend(inner.globals)
        outer.calls.extend(inner.calls)
        outer.persistent_ids.extend(inner.persistent_ids)
        self.objects += vm.objects
        if inner.error is not None:
            raise inner.error
        if not inner.stopped:
            raise self.error("nested pickle ends without STOP", at)
        return inner

    def _persistent(self, pid: Any, pos: int) -> None:
        self.result.persistent_ids.append((pid, pos))
        if self.persistent_load is None:
            self.stack.append(PersistentRef(pid, pos))
        else:
            self.stack.append(self.external("persistent_load", self.persistent_load, pid, pos))

    def op_PERSID(self, pos: int) -> int:
        text, nxt = self.readline("PERSID", pos, pos + 1)
        try:
            pid = text.decode("ascii")
        except UnicodeDecodeError:
            raise self.error("persistent IDs in protocol 0 must be ASCII strings", pos) from None
        self._persistent(pid, pos)
        return nxt

    def _ext(self, code: int, pos: int, name: str, size: int) -> int:
        if code <= 0:
            raise self.error(f"{name} specifies code <= 0", pos)
        self.result.globals.append(
            GlobalSeen("copyreg", f"_inverted_registry[{code}]", pos, name))
        self.stack.append(Extension(code, pos))
        return pos + 1 + size

    def op_EXT1(self, pos: int) -> int:
        return self._ext(self.data[pos + 1], pos, "EXT1", 1)

    def op_EXT2(self, pos: int) -> int:
        return self._ext(_U16.unpack_from(self.data, pos + 1)[0], pos, "EXT2", 2)

    def op_EXT4(self, pos: int) -> int:
        return self._ext(_I32.unpack_from(self.data, pos + 1)[0], pos, "EXT4", 4)


def _build_slow_table() -> list:
    methods = {name[3:]: fn for name, fn in vars(_VM).items() if name.startswith("op_")}
    inline = set(_INLINE)
    if len(inline) != len(_INLINE) or inline & methods.keys():
        raise ImportError(f"opcodes handled twice: {sorted(inline & methods.keys())}")
    known = set(_CODE)
    if inline | methods.keys() != known:
        raise ImportError(f"dispatch does not match pickletools: missing "
                          f"{sorted(known - inline - methods.keys())}, unknown "
                          f"{sorted((inline | methods.keys()) - known)}")
    table: list = [None] * 256
    for name, fn in methods.items():
        table[_CODE[name]] = fn
    return table


_SLOW_TABLE = _build_slow_table()

if _STEP is not None:
    try:
        _STEP.bind_vm(Global, _SMALL_TUPLES, _small_tuple, _ordered_dict)
    except TypeError:   # Global's slots are not what it reads: a stale build (tests fail on it)
        _STEP = None


def run(data: bytes | memoryview, *, start: int = 0, persistent_load=None,
        hooks: Mapping[tuple[str, str], Callable[[tuple, int], object]] | None = None,
        build_hooks: Mapping[tuple[str, str], Callable] | None = None,
        limits: Limits = DEFAULT_LIMITS, file: str | None = None, member: str | None = None,
        base_offset: int = 0, record_calls: bool = True) -> PickleResult:
    """Run one pickle symbolically, from ``data[start]`` to its STOP.

    Args:
        data: the bytes (a memoryview over an mmap is fine: nothing is copied but strings).
        start: offset of the first opcode in ``data``.
        persistent_load: ``f(pid, pos) -> object`` for PERSID/BINPERSID; it MAY raise
            FormatError (kept as ``result.error``). Without it a `PersistentRef` is pushed.
        hooks: ``{(module, name): f(args, pos) -> object}`` applied when REDUCE, NEWOBJ,
            NEWOBJ_EX (without kwargs), INST or OBJ calls that `Global`; e.g. `CONTAINER_HOOKS`.
            A hook MAY return `DECLINE` to get the inert `Call` instead. Hooks and
            persistent_load MAY raise FormatError: its ``offset``, if set, is relative to
            ``data`` like the ``pos`` they were given (the VM adds ``base_offset``; without an
            offset the opcode's is used) and file/member are filled in. Any other exception
            becomes a PickleError whose ``__cause__`` is the original.
        build_hooks: ``{(module, name): f(obj, end, nested) -> (value, next) | None}`` run after
            a BUILD onto a `Call` of that global (see the module docstring; joblib arrays).
        limits: resource bounds (`DEFAULT_LIMITS`).
        file, member, base_offset: where ``data`` comes from, for error messages; an error at
            ``pos`` reports ``offset = base_offset + pos``.
        record_calls: False for a caller that only lists (the scan needs them): ``calls`` and
            ``persistent_ids`` are `NotRecorded` (~300 bytes less per torch tensor).

    Returns:
        A `PickleResult`. Bad input never raises: it sets ``result.error`` (a `PickleError` or
        `LimitExceeded`) and keeps everything seen before.

    Raises:
        ValueError: ``start`` outside ``data`` (a caller bug, not bad input).

    Example:
        >>> r = run(b"\\x80\\x02]q\\x00(K\\x01K\\x02e.")
        >>> r.value, r.end, r.opcodes
        ([1, 2], 12, 8)
    """
    vm = _VM(data, start, persistent_load, hooks, limits, file, member, base_offset, build_hooks)
    if not record_calls:
        vm.result.calls = NotRecorded("calls")
        vm.result.persistent_ids = NotRecorded("persistent ids")
        vm.recording = False
    # The VM allocates up to millions of small acyclic objects. CPython's generational GC would
    # rescan the growing heap again and again (about a third of the run time), and it cannot
    # free anything here: pause it for the run and restore the caller's setting.
    gc_was_enabled = gc.isenabled()
    if gc_was_enabled:
        gc.disable()
    outer_guard = getattr(_ACTIVE, "guard", None)
    _ACTIVE.guard = vm.hash_guard
    try:
        return vm.execute()
    finally:
        _ACTIVE.guard = outer_guard
        if gc_was_enabled:
            gc.enable()
