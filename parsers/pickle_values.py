"""The inert values the pickle VM builds instead of running anything, and what a run returns.

`Global`, `Call`, `PersistentRef`, `OutOfBandBuffer`, `Extension`, `UnhashableKey` and
`BuildStates` stand for what a loader would import, call or fetch; `GlobalSeen`/`CallSeen` are the
evidence a run records; `PickleResult` holds both; `PickleError` and `Limits` say how a run fails
and where it stops. Nothing here reads bytes: `pickle_vm` builds these, consumers only look at them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tensorscope.errors import FormatError





class PickleError(FormatError):
    """The pickle is malformed or does something a loader would refuse."""

    def __init__(self, reason: str, **where):
        where.setdefault("format", "pickle")
        super().__init__(reason, **where)


@dataclass(frozen=True)
class Limits:
    """Resource bounds for one run. Defaults suit a 100 GB checkpoint with ~1e6 tensors
    (~35 opcodes, ~8 memo entries and ~4 objects per tensor). The opcode, depth, string and
    integer limits are exact; stack, memo and object counts are checked every 4096 opcodes and
    at STOP, so they may be overshot by that much before the run fails.

    Attributes:
        max_opcodes: opcodes executed.
        max_stack: items on the stack, all MARK levels together.
        max_memo: memo entries.
        max_objects: containers and calls built.
        max_depth: MARK nesting, and nesting of a tuple that gets hashed.
        max_string: bytes of one string/bytes argument (also checked against the bytes left).
        max_long: bytes of one LONG1/LONG4 integer built exactly (65536 bytes is ~158,000
            decimal digits); a longer one becomes an int of the same sign (the run goes on, as
            CPython's does).
    """

    max_opcodes: int = 100_000_000
    max_stack: int = 10_000_000
    max_memo: int = 50_000_000
    max_objects: int = 50_000_000
    max_depth: int = 10_000
    max_string: int = 1 << 30
    max_long: int = 1 << 16

    def __post_init__(self):
        for name in ("max_opcodes", "max_stack", "max_memo", "max_objects", "max_depth",
                     "max_string", "max_long"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")


DEFAULT_LIMITS = Limits()


# ---------------------------------------------------------------------------------------------
# Inert objects pushed by the VM.

class _NotSet:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOTSET"

    def __bool__(self) -> bool:
        return False


NOTSET = _NotSet()
"""`Call.state` before any BUILD."""


class _Decline:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DECLINE"


DECLINE = _Decline()
"""Returned by a hook: build no value, push the inert `Call` the VM would have built."""


class Global:
    """A class or function reference (GLOBAL, STACK_GLOBAL, INST, OBJ); nothing is imported.

    Hashable by identity: two GLOBAL opcodes naming the same thing give two objects.
    """

    __slots__ = ("module", "name", "pos", "_hook")

    def __init__(self, module: str, name: str, pos: int):
        self.module = module
        self.name = name
        self.pos = pos
        self._hook = None   # the run's hook for (module, name), looked up once at creation

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}"

    def __repr__(self) -> str:
        return f"Global({self.module}.{self.name})"


class BuildStates(list):
    """`Call.state` after several BUILDs whose states are not all dicts: every state, in order."""

    __slots__ = ()


class Call:
    """The inert result of a call (REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ).

    Attributes:
        func: what was called (usually a `Global`; may be another `Call`, e.g. ``getattr(...)``).
        args: the positional arguments (a tuple).
        kwargs: keyword arguments (NEWOBJ_EX only), else None.
        pos: offset of the calling opcode.
        opcode: its name.
        state: the BUILD state (`NOTSET` if none); a second BUILD merges dicts into a new dict,
            otherwise the state becomes a `BuildStates` list of every state.
        items: objects APPEND(S)ed onto it; dictitems: (key, value) pairs SETITEM(S)ed;
            setitems: objects ADDITEMSed. Read-only views (an empty list when nothing was added).
    """

    __slots__ = ("func", "args", "kwargs", "pos", "opcode", "state", "_items", "_dictitems",
                 "_setitems", "_owns_state")

    def __init__(self, func: Any, args: tuple, kwargs: dict | None, pos: int, opcode: str):
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.pos = pos
        self.opcode = opcode
        self.state = NOTSET
        self._items = None      # lists are made on first use: most calls never get any
        self._dictitems = None
        self._setitems = None
        self._owns_state = False

    @property
    def items(self) -> list:
        return self._items if self._items is not None else []

    @property
    def dictitems(self) -> list:
        return self._dictitems if self._dictitems is not None else []

    @property
    def setitems(self) -> list:
        return self._setitems if self._setitems is not None else []

    def __repr__(self) -> str:  # shallow on purpose: values may nest a million levels deep
        func = self.func.dotted if isinstance(self.func, Global) else type(self.func).__name__
        return f"Call({func}, {len(self.args)} args)"


class PersistentRef:
    """PERSID/BINPERSID when no ``persistent_load`` is given: the id and where it was."""

    __slots__ = ("pid", "pos")

    def __init__(self, pid: Any, pos: int):
        self.pid = pid
        self.pos = pos

    def __repr__(self) -> str:
        return f"PersistentRef(pos={self.pos})"


class OutOfBandBuffer:
    """NEXT_BUFFER (protocol 5): the ``index``-th out-of-band buffer; ``readonly`` after
    READONLY_BUFFER."""

    __slots__ = ("index", "pos", "readonly")

    def __init__(self, index: int, pos: int, readonly: bool = False):
        self.index = index
        self.pos = pos
        self.readonly = readonly

    def __repr__(self) -> str:
        return f"OutOfBandBuffer({self.index}, readonly={self.readonly})"


class Extension:
    """EXT1/EXT2/EXT4: a copyreg extension code. The registry is never consulted."""

    __slots__ = ("code", "pos")

    def __init__(self, code: int, pos: int):
        self.code = code
        self.pos = pos

    def __repr__(self) -> str:
        return f"Extension({self.code})"


class UnhashableKey:
    """A dict key or set item that cannot be hashed (a list, a dict ...), kept so that the
    container still builds. A real loader would fail there with TypeError."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"UnhashableKey({type(self.value).__name__})"


@dataclass(slots=True)
class GlobalSeen:
    """One global reference: GLOBAL, STACK_GLOBAL, INST, OBJ (class argument) or EXT1/2/4
    (recorded as ``copyreg._inverted_registry[code]``)."""

    module: str
    name: str
    pos: int
    opcode: str

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(slots=True)
class CallSeen:
    """One place where a loader runs code: REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ; BUILD
    (``func`` = the object, ``args`` = ``(state,)``); and APPEND(S)/SETITEM(S)/ADDITEMS onto an
    object that is not a container the VM built (``func`` = that object, ``args`` = the items,
    pairs as 2-tuples for SETITEM(S))."""

    func: Any
    args: tuple
    kwargs: dict | None
    pos: int
    opcode: str


class EvidenceNotKept(RuntimeError):
    """Evidence read from a run made with ``record_calls=False`` (a programming error)."""


class NotRecorded(list):
    """`PickleResult.calls` / ``persistent_ids`` of a run made with ``record_calls=False``: the
    VM's appends are dropped, and reading raises `EvidenceNotKept`, so that a scan of such a
    result fails loudly instead of finding no calls."""

    __slots__ = ("what",)

    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def append(self, item) -> None:
        pass

    def extend(self, items) -> None:
        pass

    def _refuse(self, *args):
        raise EvidenceNotKept(f"the pickle's {self.what} were not recorded (record_calls=False): "
                              "run it again to scan it")

    __iter__ = __len__ = __getitem__ = __bool__ = __contains__ = _refuse


@dataclass
class PickleResult:
    """What one run saw. Positions are relative to the start of ``data`` given to `run`.

    Attributes:
        value: the object returned at STOP (None if the run failed before).
        globals: every global reference, in order.
        calls: every call, in order (hooked calls included).
        persistent_ids: (pid, pos) of every PERSID/BINPERSID.
        protocol: the first PROTO's argument, None without PROTO.
        opcodes: opcodes executed (the failing one included).
        end: offset just after STOP, or of the opcode that failed.
        stopped: True when STOP was reached.
        error: the failure, or None. Results before it are kept.
        reader_disagreements: (pos, what) of every place where CPython's own readers read the
            bytes differently: an opcode that runs past the end of its FRAME (``pickle.loads``
            and buffered files read on, ``io.BytesIO`` -- torch.load's reading of a zip's
            data.pkl -- drops the rest of the frame and reads the opcode's argument from after
            it), a FRAME inside a FRAME that runs past it, a STOP with bytes left in its frame.
            The run follows the contiguous reading; a scanner MUST treat any entry as a way to
            hide opcodes from it. No writer produces these.
    """

    value: Any = None
    globals: list[GlobalSeen] = field(default_factory=list)
    calls: list[CallSeen] = field(default_factory=list)
    persistent_ids: list[tuple[object, int]] = field(default_factory=list)
    protocol: int | None = None
    opcodes: int = 0
    end: int = 0
    stopped: bool = False
    error: FormatError | None = None
    reader_disagreements: list[tuple[int, str]] = field(default_factory=list)

    def raise_for_error(self) -> None:
        """Raise `error` if the run failed."""
        if self.error is not None:
            raise self.error



_INERT_DATA = (type(None), bool, int, float, complex, str, bytes, bytearray, tuple, list, dict,
               set, frozenset)

# Values whose type is only known when a loader runs (what an import, a call or persistent_load
# returns): a check on their type must not stop the run, the real value may pass it.
_SYMBOLIC = (Global, Call, PersistentRef, Extension)

DYNAMIC = "<dynamic>"
"""`GlobalSeen` module or name of a STACK_GLOBAL whose operand is computed at load time."""
