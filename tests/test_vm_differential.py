"""Differential tests: our symbolic pickle VM (parsers/pickle_vm.py) against CPython's C unpickler.

The scanner's argument is: for ANY bytes, every ``find_class(module, name)`` that the C
``_pickle.Unpickler`` performs before it stops (at STOP or at an error) appears in
``pickle_vm.run(...).globals``, and our run does not stop earlier than CPython's. This module
checks that on generated opcode sequences, mutated real pickles and hand-written edge cases.

How CPython is run here WITHOUT executing anything from the input: a `_pickle.Unpickler`
subclass whose ``find_class`` only RECORDS (module, name) and returns a fresh inert stand-in
class (`_StandIn`): it accepts any constructor arguments, its instances are callable and return
another stand-in, and ``append``/``extend``/``add``/``__setitem__``/``__setstate__`` accept
anything, so REDUCE/NEWOBJ/BUILD/APPENDS/SETITEMS proceed (as far as the most permissive real
class would let them) without running anything real. ``persistent_load`` returns a stand-in too.
find_class never returns a real object named by the input, except in the ``data`` flavour, where
a fixed table of pure-data builtins (`_DATA_BUILTINS`: tuple, list, str, int ...) is returned as
itself, so that "a call whose result is a tuple/str" is modelled too; those only build data. The
only other objects are builtins the C unpickler makes itself (lists, dicts, ints, strings).

Readers compared (they differ in how reads cross a FRAME end, see `_cpython`):
  - ``bytesio``: ``io.BytesIO`` (no ``peek``): torch.load's reading of a zip's data.pkl;
  - ``buffered``: ``io.BufferedReader`` (``peek``): ``pickle.load(open(f, 'rb'))``;
  - ``memory``: a file whose ``peek`` hands over everything: ``pickle.loads`` semantics.

Checks, per input (`divergences`):
  1. CPython's recorded globals are a subset of ours (raw names; a STACK_GLOBAL whose names are
     computed at load time is matched by our `DYNAMIC_GLOBAL` record).
  2. Probe: where our run fails at opcode E, a GLOBAL ``__probe__ probe`` is inserted right after
     that opcode's bytes; if CPython gets past E it imports the probe, and then we must too.
  3. Where CPython (bytesio) reaches STOP, we reach STOP at the same offset (outside FRAMEs,
     where BytesIO's tell() is exact).
  4. Pickles without globals, persistent ids or extensions: our value equals CPython's.

``TENSORSCOPE_VM_DIFF_EXAMPLES`` scales the hypothesis runs (CI default: small, derandomized).
"""
from __future__ import annotations

import _pickle
import collections
import datetime
import decimal
import fractions
import io
import os
import pickle
import pickletools
import struct
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorscope.parsers import pickle_vm

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("TENSORSCOPE_VM_DIFF_EXAMPLES", "150"))
PROBE = b"c__probe__\nprobe\n"
PROBE_NAME = ("__probe__", "probe")


# ---------------------------------------------------------------------------------------------
# CPython side: records find_class, builds only inert stand-ins.

class _StandInMeta(type):
    """Metaclass of the stand-ins: item assignment on the class object itself is accepted."""

    def __setitem__(cls, key, value):
        pass


class _StandIn(metaclass=_StandInMeta):
    """What find_class returns: inert, callable, and every method a loader calls accepts anything.

    The methods take ``*args`` so that they also work looked up on the class object (a BUILD or
    APPEND straight onto the GLOBAL)."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _StandIn()

    def append(*args):
        pass

    def extend(*args):
        pass

    def add(*args):
        pass

    def __setitem__(*args):
        pass

    def __setstate__(*args):
        pass


# Pure-data builtins returned as themselves in the ``data`` flavour: calling them builds data from
# data (never code); they model "a call whose result is a real tuple/str/list/dict".
_DATA_BUILTINS = {(m, t.__name__): t for m in ("builtins", "__builtin__")
                  for t in (tuple, list, dict, str, int, float, complex, bool, slice)}


def _encode(text, encoding="utf-8", errors="strict"):
    """_codecs.encode for the few encodings the VM's hook knows; any other name is refused
    here (a real lookup would import an ``encodings`` module named by the input)."""
    if encoding not in ("latin1", "latin-1", "utf-8", "utf8", "ascii", "iso-8859-1"):
        raise LookupError(encoding)
    return text.encode(encoding, errors)


def _sized(cls):
    """bytes/bytearray that refuse to allocate what an int from the input claims (the VM's hook
    builds an inert Call there and reads on, so refusing can only make CPython stop earlier)."""
    def make(*args, **kwargs):
        if args and isinstance(args[0], int) and args[0] > 1 << 16:
            raise MemoryError("refused in the test")
        return cls(*args, **kwargs)
    return make


# What the VM's CONTAINER_HOOKS model as the real thing (a hooked global builds a concrete value
# there): returned as themselves in every flavour, so both sides mean the same objects.
_HOOKED = {**{(m, t.__name__): t for m in ("builtins", "__builtin__") for t in (set, frozenset)},
           **{(m, t.__name__): _sized(t) for m in ("builtins", "__builtin__")
              for t in (bytes, bytearray)},
           ("collections", "OrderedDict"): collections.OrderedDict,
           ("collections", "defaultdict"): collections.defaultdict,
           ("_codecs", "encode"): _encode}
assert set(_HOOKED) == set(pickle_vm.CONTAINER_HOOKS)


def _recording_unpickler(record: list, data_builtins: bool):
    class Recorder(_pickle.Unpickler):
        def find_class(self, module, name):
            record.append((module, name))
            if (module, name) in _HOOKED:
                return _HOOKED[(module, name)]
            if data_builtins and (module, name) in _DATA_BUILTINS:
                return _DATA_BUILTINS[(module, name)]
            return _StandInMeta("StandIn", (_StandIn,), {})

        def persistent_load(self, pid):
            return _StandIn()

    return Recorder


class _PeekAll(io.RawIOBase):
    """A file whose peek() returns everything left: the C unpickler then reads from one buffer,
    as pickle.loads does."""

    def __init__(self, data: bytes):
        self._b = io.BytesIO(data)

    def readable(self):
        return True

    def read(self, n=-1):
        return self._b.read(n)

    def readinto(self, buf):
        return self._b.readinto(buf)

    def readline(self, n=-1):
        return self._b.readline(n)

    def peek(self, n=0):
        at = self._b.tell()
        return self._b.getvalue()[at:]

    def tell(self):
        return self._b.tell()


class CPythonRun:
    __slots__ = ("globals", "tell", "stopped", "value", "error")

    def __init__(self, globals_, tell, stopped, value, error):
        self.globals, self.tell, self.stopped, self.value, self.error = (
            globals_, tell, stopped, value, error)

    def __repr__(self):
        return (f"CPython(stopped={self.stopped}, tell={self.tell}, globals={self.globals}, "
                f"error={self.error!r})")


def _cpython(data: bytes, reader: str = "bytesio", encoding: str = "latin1",
             data_builtins: bool = False) -> CPythonRun:
    """Run the C unpickler over ``data`` with recording find_class (see the module docstring)."""
    record: list = []
    if reader == "bytesio":
        f = io.BytesIO(data)
    elif reader == "buffered":
        f = io.BufferedReader(io.BytesIO(data), buffer_size=8192)
    else:
        f = _PeekAll(data)
    buffers = [b"oob%d" % i for i in range(64)]
    unpickler = _recording_unpickler(record, data_builtins)(f, encoding=encoding,
                                                            buffers=buffers)
    try:
        value = unpickler.load()
        stopped, error = True, None
    except RecursionError as exc:   # pragma: no cover - deep nesting in a generated input
        value, stopped, error = None, False, exc
    except Exception as exc:    # any error is a stop; which one does not matter here
        value, stopped, error = None, False, exc
    return CPythonRun(record, f.tell(), stopped, value, error)


# ---------------------------------------------------------------------------------------------
# Our side.

def _ours(data: bytes) -> pickle_vm.PickleResult:
    return pickle_vm.run(data, hooks=pickle_vm.CONTAINER_HOOKS)


def _our_names(r: pickle_vm.PickleResult) -> set:
    return {(g.module, g.name) for g in r.globals}


def _extent(data: bytes, pos: int) -> int:
    """Bytes of the opcode at ``pos`` with its argument, as pickletools decodes it (the rest of
    the data when the argument is cut short or the opcode unknown)."""
    stream = io.BytesIO(data[pos:])
    try:
        next(pickletools.genops(stream))
    except Exception:
        return len(data) - pos
    return stream.tell()


def _has_frame(data: bytes) -> bool:
    return b"\x95" in data


def _same_value(a, b) -> bool:
    """Equal data, compared by its pickle (NaN-safe, self-references, exact types)."""
    try:
        return pickle.dumps(a, protocol=5) == pickle.dumps(b, protocol=5)
    except (RecursionError, pickle.PicklingError, TypeError):
        return True     # not comparable this way (deep nesting): other checks still apply


def _covered(cpython_names, ours: set) -> list:
    """The names CPython imported that our run does not list. A STACK_GLOBAL of names computed
    at load time is recorded by us with `pickle_vm.DYNAMIC` (judged CRITICAL): it stands for any."""
    if any(pickle_vm.DYNAMIC in pair for pair in ours):
        return []
    return [name for name in cpython_names if name not in ours]


def divergences(data: bytes, probe: bool = True) -> list[str]:
    """Every way CPython gets further than our VM on ``data`` (empty when none)."""
    out: list[str] = []
    r = _ours(data)
    ours = _our_names(r)
    # Where CPython's readers disagree (an opcode across a FRAME end), we follow the contiguous
    # reading (memory) and report the disagreement, which the scanner judges CRITICAL.
    readers = ("memory",) if r.reader_disagreements else ("bytesio", "buffered", "memory")
    for reader in readers:
        for data_builtins in (False, True):
            c = _cpython(data, reader, data_builtins=data_builtins)
            missing = _covered(dict.fromkeys(c.globals), ours)
            if missing:
                out.append(f"{reader}{'+data' if data_builtins else ''}: CPython imports "
                           f"{missing} that we miss ({c!r}; ours end={r.end} "
                           f"stopped={r.stopped} error={r.error})")
    c = _cpython(data, "bytesio")
    if c.stopped and not _has_frame(data) and not r.reader_disagreements and not (r.stopped and r.end == c.tell):
        out.append(f"CPython stops at {c.tell}, ours: end={r.end} stopped={r.stopped} "
                   f"error={r.error}")
    if c.stopped and r.stopped and not r.globals and not r.persistent_ids and \
            not any(g.opcode.startswith("EXT") for g in r.globals):
        ca = _cpython(data, "bytesio", encoding="ASCII")
        if ca.stopped and not _same_value(ca.value, r.value) and \
                "OutOfBandBuffer" not in repr(r.value):
            out.append(f"value: CPython {ca.value!r}, ours {r.value!r}")
    if probe and not r.stopped and r.error is not None:
        at = min(len(data), r.end + _extent(data, r.end))
        probed = data[:at] + PROBE + data[at:]
        for problem in divergences(probed, probe=False):
            out.append(f"probe after our failing opcode at {r.end} ({r.error}): {problem}")
    return out


# ---------------------------------------------------------------------------------------------
# Input generators.

_NAMES = [("os", "system"), ("builtins", "eval"), ("__builtin__", "set"),
          ("copy_reg", "_reconstructor"), ("collections", "OrderedDict"), ("builtins", "tuple"),
          ("builtins", "str"), ("__builtin__", "list"), ("builtins", "dict"),
          ("torch._utils", "_rebuild_tensor_v2"), ("a.b", "c d"), ("m", "n.o"), ("é", "ü"),
          ("x\r", "y\r"), ("", "n"), ("exceptions", "Exception"), ("builtins", "bytearray"),
          ("builtins", "getattr"), ("builtins", "frozenset")]

_name = st.sampled_from(_NAMES)
_small = st.integers(0, 6)


def _line(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass") + b"\n"


def _arg_strategy(arg_name: str | None):
    u = struct.pack
    if arg_name is None:
        return st.just(b"")
    table = {
        "uint1": _small.map(lambda i: bytes([i])) | st.integers(0, 255).map(lambda i: bytes([i])),
        "uint2": _small.map(lambda i: u("<H", i)) | st.integers(0, 0xFFFF).map(lambda i: u("<H", i)),
        # (memo indices stay small: CPython's memo is an array as long as the largest index)
        "uint4": _small.map(lambda i: u("<I", i)) | st.integers(0, 2**16).map(lambda i: u("<I", i)),
        "int4": st.integers(-3, 6).map(lambda i: u("<i", i)) | st.integers(-2**31, 2**31 - 1).map(lambda i: u("<i", i)),
        "uint8": st.integers(0, 40).map(lambda i: u("<Q", i)) | st.integers(0, 2**64 - 1).map(lambda i: u("<Q", i)),
        "float8": st.floats(allow_nan=True).map(lambda f: u(">d", f)),
        "decimalnl_short": st.sampled_from([b"0", b"1", b"01", b"00", b"-1", b"2", b"0x10", b"010",
                                            b" 3", b"3 ", b"99999999999999999999", b"abc", b"",
                                            b"1_0", b"+4", b"\xff"]).map(lambda b: b + b"\n"),
        "decimalnl_long": st.sampled_from([b"0L", b"1", b"-5L", b"12345678901234567890L", b"L",
                                           b"0x10", b"1_000", b" 7", b"x"]).map(lambda b: b + b"\n"),
        "floatnl": st.sampled_from([b"1.5", b"nan", b"-inf", b"1e400", b" 1.0", b"1_0.0", b"x",
                                    b"0"]).map(lambda b: b + b"\n"),
        "stringnl": st.sampled_from([b"'abc'", b'"abc"', b"'a\\nb'", b"'\\x41'", b"'\\x4'",
                                     b"'abc", b"abc", b"''", b"'", b"'\xc3\xa9'", b"'\xff'",
                                     b"'a\\'b'", b"\"a'\""]).map(lambda b: b + b"\n"),
        "stringnl_noescape": st.sampled_from([b"0", b"pid", b"\xff", b""]).map(lambda b: b + b"\n"),
        "stringnl_noescape_pair": _name.map(lambda p: _line(p[0]) + _line(p[1])),
        "unicodestringnl": st.sampled_from([b"abc", b"\\u00e9", b"\\u12", b"\xe9", b"\\x41"]).map(
            lambda b: b + b"\n"),
        "string1": st.binary(max_size=8).map(lambda b: bytes([len(b)]) + b),
        "bytes1": st.binary(max_size=8).map(lambda b: bytes([len(b)]) + b),
        "string4": st.binary(max_size=8).map(lambda b: u("<i", len(b)) + b),
        "bytes4": st.binary(max_size=8).map(lambda b: u("<I", len(b)) + b),
        "bytes8": st.binary(max_size=8).map(lambda b: u("<Q", len(b)) + b),
        "bytearray8": st.binary(max_size=8).map(lambda b: u("<Q", len(b)) + b),
        "unicodestring1": st.sampled_from([n for p in _NAMES for n in p] + ["\ud800"]).map(
            lambda s: (lambda b: bytes([len(b)]) + b)(s.encode("utf-8", "surrogatepass"))),
        "unicodestring4": st.sampled_from([n for p in _NAMES for n in p]).map(
            lambda s: (lambda b: u("<I", len(b)) + b)(s.encode())),
        "unicodestring8": st.sampled_from([n for p in _NAMES for n in p]).map(
            lambda s: (lambda b: u("<Q", len(b)) + b)(s.encode())),
        "long1": st.binary(max_size=9).map(lambda b: bytes([len(b)]) + b),
        "long4": st.binary(max_size=9).map(lambda b: u("<i", len(b)) + b)
        | st.just(u("<i", -1)) | st.just(u("<i", 2**31 - 1)),
    }
    return table[arg_name]


_OPCODE_CHUNKS = {op.name: st.tuples(st.just(op.code.encode("latin-1")),
                                     _arg_strategy(op.arg.name if op.arg else None)).map(b"".join)
                  for op in pickletools.opcodes}
# A frequent few make deep programs: names for STACK_GLOBAL, marks and tuples for calls.
_HELPERS = st.one_of(
    _name.map(lambda p: b"".join(b"\x8c" + bytes([len(s.encode())]) + s.encode() for s in p)
              + b"\x93"),
    _name.map(lambda p: b"c" + _line(p[0]) + _line(p[1])),
    st.just(b"(K\x01t"), st.just(b")"), st.just(b"}"), st.just(b"]"), st.just(b"("),
    st.just(b"R"), st.just(b"b"), st.just(b"\x81"), st.just(b"\x85"), st.just(b"\x94"),
    st.just(b"h\x00"), st.just(b"e"), st.just(b"u"), st.just(b"s"),
)
_chunk = st.one_of(st.sampled_from(sorted(_OPCODE_CHUNKS)).flatmap(lambda n: _OPCODE_CHUNKS[n]),
                   _HELPERS)


@st.composite
def opcode_programs(draw) -> bytes:
    """A generated opcode sequence with valid-ish arguments, maybe framed, truncated or spliced."""
    proto = draw(st.sampled_from([None, 0, 1, 2, 3, 4, 5, 6]))
    body = b"".join(draw(st.lists(_chunk, max_size=24)))
    if draw(st.booleans()):
        body += b"."
    if draw(st.integers(0, 4)) == 0:        # a FRAME whose length may lie
        cut = draw(st.integers(0, len(body)))
        length = draw(st.sampled_from([cut, len(body), 0, cut + 1, max(0, cut - 1), 2**40]))
        body = b"\x95" + struct.pack("<Q", length) + body
    head = b"" if proto is None else b"\x80" + bytes([proto])
    data = head + body
    mutation = draw(st.integers(0, 5))
    if mutation == 0 and data:
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif mutation == 1:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=4)) + data[at:]
    elif mutation == 2:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(_chunk) + data[at:]
    return data


class _Point:
    def __init__(self, x):
        self.x = x


def _plain_pickles() -> list[bytes]:
    values = [
        None, True, 1, -1, 2**70, 1.5, "é", b"by", bytearray(b"ba"), [1, [2]], (1, (2, 3)),
        {"a": 1, 2: [3]}, {1, 2}, frozenset({3}), collections.OrderedDict(a=1),
        collections.defaultdict(list, a=[1]), complex(1, 2), datetime.date(2020, 1, 2),
        decimal.Decimal("1.5"), fractions.Fraction(1, 3), _Point(3), [_Point(1)] * 2,
        collections.Counter("abca"), range(3), slice(1, 2), {"k": ("x" * 300, b"y" * 300)},
    ]
    out = []
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        for v in values:
            out.append(pickle.dumps(v, protocol=proto))
    return out


def _torch_pickles() -> list[bytes]:
    out = []
    for path in sorted((ROOT / "fixtures" / "torch").glob("*")):
        if not zipfile.is_zipfile(path):
            continue
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if name.endswith(".pkl") and z.getinfo(name).file_size < 200_000:
                    out.append(z.read(name))
    return out


REAL_PICKLES = _plain_pickles() + _torch_pickles()


@st.composite
def mutated_real_pickles(draw) -> bytes:
    data = draw(st.sampled_from(REAL_PICKLES))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.integers(0, 4))
        at = draw(st.integers(0, len(data)))
        if kind == 0:
            data = data[:at]
        elif kind == 1 and at < len(data):
            data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
        elif kind == 2:
            data = data[:at] + draw(_chunk) + data[at:]
        elif kind == 3:
            end = draw(st.integers(at, min(len(data), at + 8)))
            data = data[:at] + data[end:]
        else:
            data = data[:at] + draw(st.binary(min_size=1, max_size=3)) + data[at:]
    return data


_SETTINGS = settings(max_examples=EXAMPLES, derandomize=EXAMPLES <= 500, deadline=None,
                     suppress_health_check=list(HealthCheck))


@_SETTINGS
@given(opcode_programs())
def test_generated_programs(data):
    assert divergences(data) == [], data


@_SETTINGS
@given(mutated_real_pickles())
def test_mutated_real_pickles(data):
    assert divergences(data) == [], data


@pytest.mark.parametrize("index", range(len(REAL_PICKLES)))
def test_real_pickles_agree(index):
    data = REAL_PICKLES[index]
    assert divergences(data) == []
    r = _ours(data)
    c = _cpython(data, "bytesio")
    assert r.stopped and c.stopped
    assert _our_names(r) >= set(c.globals)


# ---------------------------------------------------------------------------------------------
# Hand-written edge cases (each also a regression case: no divergence).

def ops(*parts) -> bytes:
    return b"".join(p.encode("latin-1") if isinstance(p, str) else p for p in parts)


def frame(body: bytes, length: int | None = None) -> bytes:
    return b"\x95" + struct.pack("<Q", len(body) if length is None else length) + body


Q = struct.pack
EDGE_CASES = [
    # protocol 0 text quirks
    ("I01 is True, I00 False", ops("(I01\nI00\nI1\nI0\nt.")),
    ("INT stops at NUL (strtol over a C string)", ops("(I1\x00\n(I2\nI3\ntp0\ntp1\n.")),
    ("INT of a NUL only line is 0", ops("I\x00\n.")),
    ("INT overflowing a C long", ops("I99999999999999999999\x00junk\n.")),
    ("INT in hex and octal", ops("(I0x10\nI010\nI-0x1f\nt.")),
    ("LONG with and without L", ops("(L5L\nL-7\nL12345678901234567890L\nt.")),
    ("LONG stops at NUL", ops("L118\x00591620717411303424L\n.")),
    ("LONG in hex of 5000 digits (no digit cap for power-of-two bases)",
     ops("L0x", "f" * 5000, "L\n.")),
    ("FLOAT stops at NUL", ops("F1.5\x00xyz\n.")),
    ("FLOAT of 600 digits", ops("F0.", "0" * 600, "1\n.")),
    ("GET/PUT with NUL and spaces", ops("Np 1\x00z\ng1\n.")),
    ("STRING quoting and escapes", ops("(S'a\\nb'\nS\"q'\"\nS'\\x41'\nt.")),
    ("STRING bad escape", ops("S'\\x4'\n.")),
    ("STRING unquoted", ops("S'abc\n.")),
    ("UNICODE raw-unicode-escape", ops("V\\u00e9\\x41\n.")),
    ("GLOBAL names with spaces, dots, unicode, CR", ops("ca.b\nc d\n", "c\xc3\xa9\n\xc3\xbc\n",
                                                        "cos\r\nsystem\r\n", "(t.")),
    ("GLOBAL with an empty module line", ops("c\nsystem\n.")),
    ("INST with a dotted name", ops("(S'x'\nios.path\njoin\n.")),
    ("py2 names", ops("c__builtin__\neval\nccopy_reg\n_reconstructor\ncexceptions\nException\n.")),
    ("STACK_GLOBAL of ints", ops("\x80\x04K\x01K\x02\x93.")),
    ("STACK_GLOBAL of bytes", ops("\x80\x04C\x02osC\x06system\x93.")),
    # frames
    ("FRAME too long", ops("\x80\x04", frame(b"N.", 16))),
    ("FRAME too short: the STOP is outside", ops("\x80\x04", frame(b"N", 1), ".")),
    ("FRAME of zero bytes", ops("\x80\x04", frame(b""), "N.")),
    ("FRAME nested inside a FRAME, fitting", ops("\x80\x04", frame(frame(b"N.") + b"")[:-0 or None])),
    ("FRAME nested inside a FRAME, running past it",
     ops("\x80\x04\x95", Q("<Q", 10), "\x95", Q("<Q", 3), "K\x01K\x02.")),
    ("STOP with bytes left in its frame", ops("\x80\x04", frame(b"N.junk"))),
    # stack and memo
    ("MEMOIZE on an empty stack", ops("\x80\x04\x94N.")),
    ("MEMOIZE right after MARK", ops("\x80\x04N(\x94.")),
    ("GET of a missing key", ops("g7\n.")),
    ("BINGET of a missing key then a global", ops("h\x05cos\nsystem\n.")),
    ("opcodes after a failed one", ops("0cos\nsystem\n.")),
    ("POP on a mark pops the mark", ops("N(0.")),
    ("POP_MARK", ops("N(K\x011.")),
    ("POP_MARK without mark", ops("N1.")),
    # container opcodes on stand-ins and on data
    ("APPENDS onto a global (calls extend)", ops("cm\nn\n(K\x01K\x02e.")),
    ("APPEND onto a global", ops("cm\nn\nK\x01a.")),
    ("SETITEMS onto a global (calls __setitem__)", ops("cm\nn\n(K\x01K\x02u.")),
    ("ADDITEMS onto a global (calls add)", ops("\x80\x04cm\nn\n(K\x01\x90.")),
    ("BUILD onto a global (calls __setstate__)", ops("cm\nn\n}b.")),
    ("BUILD onto an int with None state", ops("K\x01Nb.")),
    ("SETITEMS onto a list with a bool index", ops("]K\x07aK\x08a(\x88K\x02u.")),
    ("SETITEMS onto a bytearray", ops("\x80\x05\x96", Q("<Q", 2), "ab(K\x00K\x41u.")),
    ("APPENDS onto a tuple", ops(")(K\x01e.")),
    ("ADDITEMS onto a frozenset", ops("\x80\x04(\x91(K\x01\x90.")),
    ("dict subclass via REDUCE then SETITEMS",
     ops("ccollections\nOrderedDict\n)R(K\x01K\x02u.")),
    ("APPEND onto an OrderedDict fails for real", ops("ccollections\nOrderedDict\n)RK\x01a.")),
    ("list via REDUCE then APPENDS", ops("c__builtin__\nlist\n)R(K\x01e.")),
    # extensions (copyreg's registry is empty: every code is unregistered)
    ("EXT1 code 1", ops("\x80\x02\x82\x01.")),
    ("EXT2 code 0", ops("\x80\x02\x83\x00\x00.")),
    ("EXT4 negative", ops("\x80\x02\x84\xff\xff\xff\xff.")),
    # sizes
    ("LONG4 negative size", ops("\x80\x02\x8b\xff\xff\xff\xff.")),
    # beyond Limits.max_long: CPython reads on, so must we (a payload after it was hidden)
    ("LONG4 of 70000 bytes, then a global", ops("\x80\x02\x8b", Q("<i", 70000), b"\x01" * 70000,
                                                "0cos\nsystem\n.")),
    ("BINUNICODE8 of 2**32", ops("\x80\x04\x8d", Q("<Q", 2**32), "abc.")),
    ("BINSTRING negative", ops("T\xff\xff\xff\xff.")),
    # calls
    ("NEWOBJ_EX with kwargs", ops("\x80\x04cm\nn\n)}\x8c\x01k\x8c\x01v\x86\x94\x92.")),
    ("NEWOBJ_EX with non-str kwargs keys", ops("\x80\x04cm\nn\n)(K\x01K\x02d\x92.")),
    ("NEWOBJ on a non-type", ops("\x80\x02K\x01)\x81.")),
    ("REDUCE with a list as arguments", ops("cm\nn\n]R.")),
    ("OBJ without class", ops("(o.")),
    # out-of-band buffers
    ("NEXT_BUFFER", ops("\x80\x05\x97.")),
    ("READONLY_BUFFER of a buffer", ops("\x80\x05\x97\x98.")),
    ("READONLY_BUFFER of a str", ops("\x80\x05\x8c\x01a\x98.")),
    # protocol
    ("PROTO 6", ops("\x80\x06N.")),
    ("PROTO not first", ops("N0\x80\x02N.")),
    ("PROTO twice", ops("\x80\x02\x80\x05N.")),
]


@pytest.mark.parametrize("name,data", EDGE_CASES, ids=[c[0] for c in EDGE_CASES])
def test_edge_cases(name, data):
    assert divergences(data) == []


# ---------------------------------------------------------------------------------------------
# Regressions: each divergence found by this module, as exact bytes. Before the fix our run
# stopped (or read other bytes) where CPython went on to import os.system.

OS_SYSTEM = ops("cos\nsystem\n")
REGRESSIONS = [
    # A GLOBAL whose lines cross the FRAME end: io.BytesIO (torch.load of a zip's data.pkl)
    # drops the rest of the frame ("junk") and reads "os"/"system" after it; pickle.loads reads
    # "junkos". We follow pickle.loads and record a reader disagreement (scanner: CRITICAL).
    ("frame crossing hides a GLOBAL", ops("\x80\x04", frame(b"cjunk"), "os\nsystem\n.")),
    # bytes(5) through REDUCE: the container hook raised "unsupported arguments" and the run
    # stopped; the real bytes(5) works, so CPython reads on. Hooks now decline (inert Call).
    ("container hook with an int", ops("c__builtin__\nbytes\nK\x05\x85R0", OS_SYSTEM, ".")),
    ("_codecs.encode with an unknown codec",
     ops("c_codecs\nencode\n(Vx\nVutf-16\ntR0", OS_SYSTEM, ".")),
    # load_int parses a NUL-terminated copy of the line: "1\0" is 1 (we failed on it).
    ("INT with a NUL", ops("I1\x00\n0", OS_SYSTEM, ".")),
    ("FLOAT with a NUL", ops("F2.5\x00?\n0", OS_SYSTEM, ".")),
    # STACK_GLOBAL over names computed at load time (str('os')): we failed "requires str";
    # now recorded as DYNAMIC (scanner: CRITICAL).
    ("STACK_GLOBAL of a computed name",
     ops("\x80\x04cbuiltins\nstr\nX\x02\x00\x00\x00os\x85R\x8c\x06system\x93.")),
    ("STACK_GLOBAL of a global's value (os.name is a str)",
     ops("\x80\x04cos\nname\n\x8c\x06system\x93.")),
    # An argument tuple computed at load time (tuple([])): we failed "must be a tuple".
    ("REDUCE of computed arguments", ops("cm\nn\nc__builtin__\ntuple\n]\x85RR0", OS_SYSTEM, ".")),
    ("NEWOBJ of computed arguments",
     ops("\x80\x02cm\nn\nc__builtin__\ntuple\n]\x85R\x810", OS_SYSTEM, ".")),
    # list.__setitem__ takes a bool index; bytearray supports item assignment.
    ("SETITEMS onto a list, bool index", ops("]K\x07aK\x08a(\x88K\x02u0", OS_SYSTEM, ".")),
    ("SETITEMS onto a bytearray", ops("\x80\x05\x96", Q("<Q", 2), "ab(K\x00K\x41u0", OS_SYSTEM, ".")),
    # LONG4 beyond Limits.max_long: we stopped with LimitExceeded, CPython reads on.
    ("LONG4 beyond max_long", ops("\x80\x02\x8b", Q("<i", 70000), b"\x01" * 70000, "0", OS_SYSTEM,
                                  ".")),
]


@pytest.mark.parametrize("name,data", REGRESSIONS, ids=[c[0] for c in REGRESSIONS])
def test_regressions(name, data):
    assert divergences(data) == []
    r = _ours(data)
    assert ("os", "system") in _our_names(r) or r.reader_disagreements or \
        any(pickle_vm.DYNAMIC in pair for pair in _our_names(r))


@pytest.mark.parametrize("name,data,rule", [
    ("frame crossing", REGRESSIONS[0][1], "pickle.reader-disagreement"),
    ("STOP inside a frame with bytes left", ops("\x80\x04", frame(b"N.junk")),
     "pickle.reader-disagreement"),
    ("computed STACK_GLOBAL", REGRESSIONS[5][1], "pickle.dynamic-global"),
    ("INT with a NUL", REGRESSIONS[3][1], "pickle.dangerous-global"),
    ("container hook with an int", REGRESSIONS[1][1], "pickle.dangerous-global"),
])
def test_scanner_judges_gaps_critical(tmp_path, name, data, rule):
    from tensorscope.scanning import Severity, scan_file
    path = tmp_path / "x.pkl"
    path.write_bytes(data)
    findings = scan_file(str(path)).findings
    assert any(f.rule == rule and f.severity == Severity.CRITICAL for f in findings), findings
