"""Shared pieces of tensorscope's fuzzing tools: seeds, structural boundaries, mutators, and the
one exercise every input goes through.

Used by `fuzz/run_long.py` (mutation loop, no atheris needed), the atheris harnesses
`fuzz/fuzz_<target>.py`, and `tests/test_fuzz.py`.

Invariants checked by `exercise` (issue #9):

- ``tensorscope.open(path)``, then ``read()`` of every tensor, then ``tensorscope.scan(path)``
  each end with a result or a `TensorscopeError`; ``scan`` never raises at all.
- Nothing executes (checked by the callers' audit hooks), nothing is read outside the input's
  folder, time and memory stay bounded (checked by the callers: deadlines, maxrss).

Boundaries are where a parser changes state: zip local headers, central directory and EOCD
fields; pickle opcode positions (``pickletools.genops``, a decoder that executes nothing, used here
on trusted fixtures and their mutants only); the safetensors header end and its numbers; ONNX
(protobuf) tags and length varints; the npy header end and shape digits; GGUF KV and tensor-info
fields. A `Field` marks an integer the format trusts (a length, a count, an offset), which the
mutators inflate, zero or set to what the file could not hold.
"""
from __future__ import annotations

import io
import os
import pickletools
import random
import re
import shutil
import struct
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ROOT", "FIXTURES", "TARGETS", "NATIVE_TARGETS", "ALL_TARGETS", "Field", "seeds", "boundaries", "mutate", "exercise",
           "exercise_bytes", "Workspace", "INTERESTING"]

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


@dataclass(frozen=True)
class Field:
    """An integer the format trusts, at ``pos``: ``width`` bytes (``kind`` "le"/"be"), a protobuf
    varint of ``width`` bytes ("varint"), or ``width`` ASCII digits ("digits")."""

    pos: int
    width: int
    kind: str = "le"


# Values a length, count or offset field is set to: zero, off by one, the sizes a 32/64-bit reader
# overflows at, and 2^60 (a BINUNICODE8 of 2^60 bytes) / 2^63 (a safetensors header of 2^63).
INTERESTING = (0, 1, 2, 7, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
               1 << 32, 1 << 40, 1 << 60, 1 << 63, (1 << 64) - 1)


# -------------------------------------------------------------------------------------------------
# Seeds

def _files(*patterns: str) -> list[Path]:
    out: list[Path] = []
    for pat in patterns:
        out.extend(p for p in sorted(FIXTURES.glob(pat)) if p.is_file())
    return out


def _is_zip(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _pickles_in(path: Path) -> list[bytes]:
    """The pickles of a fixture: the file itself, or the stored ``.pkl`` members of a zip."""
    if _is_zip(path):
        with zipfile.ZipFile(path) as z:
            return [z.read(i) for i in z.infolist() if i.filename.endswith(".pkl")]
    return [path.read_bytes()]


def _seed_table() -> dict[str, list[Path]]:
    torch_zips = [p for p in _files("torch/*", "diff/*.pt", "containers/ts_*", "distributed/pt2/*",
                                    "distributed/dcp/*/*.distcp", "distributed/sharded/bin_index/*.bin",
                                    "tui/malicious.pt") if _is_zip(p)]
    return {
        "pickle_vm": _files("containers/plain_*.pkl", "containers/legacy_p4.pt",
                            "containers/legacy_views.pt", "torch/nested.pth", "torch/quantized.pt",
                            "torch/sparse.pt", "formats/object.npy", "tui/malicious.pt"),
        "zipfmt": [p for p in torch_zips if p.stat().st_size < 12_000] + _files("formats/*.npz"),
        "torch_zip": torch_zips,
        "safetensors": _files("formats/*.safetensors", "diff/*.safetensors",
                              "distributed/sharded/single/*.safetensors"),
        "gguf": _files("formats/*.gguf"),
        "numpy": _files("formats/*.npy", "formats/*.npz"),
        "onnx": _files("onnx/*.onnx", "diff/*.onnx", "onnx/external_one/model.onnx",
                       "onnx/external_many/model.onnx"),
        "legacy": _files("containers/legacy_*.pt", "containers/plain_*.pkl"),
        # the C entry points: torch zips opened for listing; the diff kernel's pieces (any
        # fixture's bytes are values of some dtype)
        "listing": [p for p in torch_zips if p.stat().st_size < 400_000],
        "diffkernel": _files("formats/*.safetensors", "diff/*.safetensors")[:8],
    }


# The parsers' targets (what tests/test_fuzz.py runs over), then the C entry points' own
# in-memory targets (a torch zip in listing mode, the diff kernel's pieces); run_long runs both.
NATIVE_TARGETS = ("listing", "diffkernel")
TARGETS = tuple(t for t in _seed_table() if t not in NATIVE_TARGETS)
ALL_TARGETS = TARGETS + NATIVE_TARGETS
# Targets that misbehave on purpose, for the tests of the harness itself (`run_long.py` keeps
# the input of a worker that dies by a signal or hangs): never part of a run by default.
SELFTESTS = ("selftest_signal", "selftest_hang")
_SEEDS: dict[str, list[Path]] | None = None


def seeds(target: str) -> list[Path]:
    global _SEEDS
    if _SEEDS is None:
        _SEEDS = _seed_table()
    return _SEEDS["zipfmt" if target in SELFTESTS else target]


def seed_bytes(target: str) -> list[tuple[Path, bytes]]:
    """(fixture, bytes) pairs; for the pickle VM, each pickle inside the fixture."""
    out = []
    for p in seeds(target):
        if target == "pickle_vm":
            out.extend((p, b) for b in _pickles_in(p) if b)
        else:
            out.append((p, p.read_bytes()))
    return out


# -------------------------------------------------------------------------------------------------
# Structural boundaries

_ZIP_LOCAL, _ZIP_CD, _ZIP_EOCD = b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06"
_ZIP64_EOCD, _ZIP64_LOC = b"PK\x06\x06", b"PK\x06\x07"
# (offset in the record, width) of every count/size/offset/length field.
_ZIP_FIELDS = {
    _ZIP_LOCAL: [(18, 4), (22, 4), (26, 2), (28, 2)],
    _ZIP_CD: [(20, 4), (24, 4), (28, 2), (30, 2), (32, 2), (42, 4)],
    _ZIP_EOCD: [(8, 2), (10, 2), (12, 4), (16, 4), (20, 2)],
    _ZIP64_EOCD: [(4, 8), (24, 8), (32, 8), (40, 8), (48, 8)],
    _ZIP64_LOC: [(8, 8), (16, 4)],
}
_RECORD_LEN = {_ZIP_LOCAL: 30, _ZIP_CD: 46, _ZIP_EOCD: 22, _ZIP64_EOCD: 56, _ZIP64_LOC: 20}


def zip_boundaries(data: bytes) -> tuple[list[int], list[Field]]:
    cuts, fields = [], []
    for sig, spec in _ZIP_FIELDS.items():
        for m in re.finditer(re.escape(sig), data):
            p = m.start()
            cuts += [p, p + 4, min(len(data), p + _RECORD_LEN[sig])]
            fields += [Field(p + off, w) for off, w in spec if p + off + w <= len(data)]
    return cuts, fields


# Opcodes whose argument is a count or an index, and its width.
_PICKLE_LEN = {"BINSTRING": 4, "SHORT_BINSTRING": 1, "BINUNICODE": 4, "SHORT_BINUNICODE": 1,
               "BINUNICODE8": 8, "BINBYTES": 4, "SHORT_BINBYTES": 1, "BINBYTES8": 8,
               "BYTEARRAY8": 8, "FRAME": 8, "LONG1": 1, "LONG4": 4, "BINPUT": 1, "BINGET": 1,
               "LONG_BINPUT": 4, "LONG_BINGET": 4, "BININT1": 1, "BININT2": 2, "BININT": 4,
               "EXT1": 1, "EXT2": 2, "EXT4": 4}


def pickle_boundaries(data: bytes, start: int = 0) -> tuple[list[int], list[Field]]:
    """Opcode positions of the pickles from ``start`` (several in a row, as legacy files hold)."""
    cuts, fields = [], []
    pos = start
    warnings.simplefilter("ignore", DeprecationWarning)  # genops on mutants: bad escapes
    for _ in range(8):
        if pos >= len(data):
            break
        last = None
        try:
            for op, _arg, p in pickletools.genops(io.BytesIO(data[pos:])):
                cuts.append(pos + p)
                w = _PICKLE_LEN.get(op.name)
                if w:
                    fields.append(Field(pos + p + 1, w))
                last = pos + p
        except Exception:  # a fixture tail that is not a pickle (legacy storages): stop there
            break
        if last is None:
            break
        pos = last + 1
    return cuts, fields


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int] | None:
    value = shift = 0
    while pos < end and shift < 70:
        b = data[pos]
        value |= (b & 0x7F) << shift
        pos += 1
        if not b & 0x80:
            return value, pos
        shift += 7
    return None


def protobuf_boundaries(data: bytes, start: int = 0, end: int | None = None, depth: int = 0,
                        cuts: list | None = None, fields: list | None = None):
    """Tags and length varints of a protobuf message, recursing into sub-messages that parse."""
    end = len(data) if end is None else end
    cuts = [] if cuts is None else cuts
    fields = [] if fields is None else fields
    pos = start
    while pos < end:
        tag = _varint(data, pos, end)
        if tag is None or tag[0] >> 3 == 0:
            return cuts, fields, False
        cuts.append(pos)
        wire, pos = tag[0] & 7, tag[1]
        if wire == 0:
            v = _varint(data, pos, end)
            if v is None:
                return cuts, fields, False
            fields.append(Field(pos, v[1] - pos, "varint"))
            pos = v[1]
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            v = _varint(data, pos, end)
            if v is None or v[1] + v[0] > end:
                return cuts, fields, False
            fields.append(Field(pos, v[1] - pos, "varint"))
            inner_start, pos = v[1], v[1] + v[0]
            cuts.append(inner_start)
            if depth < 12 and v[0] > 1:
                n_c, n_f = len(cuts), len(fields)
                _, _, ok = protobuf_boundaries(data, inner_start, pos, depth + 1, cuts, fields)
                if not ok:  # bytes or text, not a message
                    del cuts[n_c:], fields[n_f:]
        else:
            return cuts, fields, False
    cuts.append(end)
    return cuts, fields, pos == end


def safetensors_boundaries(data: bytes) -> tuple[list[int], list[Field]]:
    if len(data) < 8:
        return [], []
    n = int.from_bytes(data[:8], "little")
    cuts, fields = [0, 8, min(len(data), 8 + n)], [Field(0, 8)]
    header = data[8:8 + n]
    for m in re.finditer(rb"\d+", header):
        fields.append(Field(8 + m.start(), m.end() - m.start(), "digits"))
    cuts += [8 + m.start() for m in re.finditer(rb'[{}\[\],:]', header)]
    return cuts, fields


def npy_boundaries(data: bytes) -> tuple[list[int], list[Field]]:
    if len(data) < 10:
        return [6, 8], []
    major = data[6]
    width = 2 if major == 1 else 4
    n = int.from_bytes(data[8:8 + width], "little")
    end = 8 + width + n
    cuts, fields = [6, 7, 8, 8 + width, min(len(data), end)], [Field(8, width)]
    for m in re.finditer(rb"\d+", data[8 + width:end]):
        fields.append(Field(8 + width + m.start(), m.end() - m.start(), "digits"))
    return cuts, fields


_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_boundaries(data: bytes) -> tuple[list[int], list[Field]]:
    """Header counts, every KV (key length, type, array count) and tensor-info field."""
    cuts, fields = [0, 4, 8, 16, 24], []
    if len(data) < 24:
        return cuts, fields
    e = "<" if int.from_bytes(data[4:8], "little") < 0x10000 else ">"
    kind = "le" if e == "<" else "be"
    fields += [Field(8, 8, kind), Field(16, 8, kind)]
    n_tensors, n_kv = struct.unpack_from(e + "QQ", data, 8)
    pos = 24

    def u(fmt, at):
        return struct.unpack_from(e + fmt, data, at)[0]

    def value(t, at, depth=0):
        if t in _GGUF_SCALAR:
            return at + _GGUF_SCALAR[t]
        if t == 8:
            fields.append(Field(at, 8, kind))
            return at + 8 + u("Q", at)
        if t == 9 and depth < 4:
            inner, count = u("I", at), u("Q", at + 4)
            fields.append(Field(at + 4, 8, kind))
            at += 12
            for _ in range(min(count, 100_000)):
                at = value(inner, at, depth + 1)
            return at
        raise ValueError(t)

    try:
        for _ in range(min(n_kv, 10_000)):
            cuts.append(pos)
            fields.append(Field(pos, 8, kind))
            pos += 8 + u("Q", pos)
            fields.append(Field(pos, 4, kind))
            t = u("I", pos)
            pos = value(t, pos + 4)
        for _ in range(min(n_tensors, 10_000)):
            cuts.append(pos)
            fields.append(Field(pos, 8, kind))
            pos += 8 + u("Q", pos)
            fields.append(Field(pos, 4, kind))
            nd = u("I", pos)
            fields += [Field(pos + 4 + 8 * i, 8, kind) for i in range(min(nd, 8))]
            pos += 4 + 8 * nd
            fields += [Field(pos, 4, kind), Field(pos + 4, 8, kind)]
            pos += 12
        cuts.append(pos)
    except (struct.error, ValueError, OverflowError):
        pass
    return [c for c in cuts if c <= len(data)], [f for f in fields if f.pos + f.width <= len(data)]


def boundaries(data: bytes) -> tuple[list[int], list[Field]]:
    """Cut points and trusted integer fields of ``data``, by its content."""
    try:
        return _boundaries(data)
    except Exception:  # a mutant this walker cannot follow: fall back to the ends
        return [0, len(data)], []


def _boundaries(data: bytes) -> tuple[list[int], list[Field]]:
    cuts: list[int] = [0, len(data)]
    fields: list[Field] = []
    head = data[:8]
    if head.startswith(b"PK"):
        c, f = zip_boundaries(data)
        cuts += c
        fields += f
        for m in re.finditer(rb"PK\x03\x04", data):  # stored pickles/npy headers inside members
            p = m.start()
            if p + 30 > len(data):
                continue
            nl, xl = struct.unpack_from("<HH", data, p + 26)
            body = p + 30 + nl + xl
            name = data[p + 30:p + 30 + nl]
            if name.endswith(b".pkl") and data[p + 8] == 0:
                c, f = pickle_boundaries(data, body)
                cuts += c
                fields += f
    elif head.startswith(b"\x93NUMPY"):
        c, f = npy_boundaries(data)
        cuts += c
        fields += f
        hl = 2 if data[6:7] == b"\x01" else 4
        if len(data) > 8 + hl:
            body = 8 + hl + int.from_bytes(data[8:8 + hl], "little")
            if data[body:body + 1] == b"\x80":  # an object array: a pickle follows
                c, f = pickle_boundaries(data, body)
                cuts += c
                fields += f
    elif head.startswith(b"GGUF") or head.startswith(b"FUGG"):
        c, f = gguf_boundaries(data)
        cuts += c
        fields += f
    elif head[:1] in (b"\x80", b"(", b"c", b"]", b"}"):
        c, f = pickle_boundaries(data)
        cuts += c
        fields += f
    elif len(data) > 9 and data[8:9] == b"{":
        c, f = safetensors_boundaries(data)
        cuts += c
        fields += f
    else:
        c, f, _ = protobuf_boundaries(data)
        cuts += c
        fields += f
    return sorted({c for c in cuts if 0 <= c <= len(data)}), fields


# -------------------------------------------------------------------------------------------------
# Mutators

def _set_field(data: bytearray, f: Field, value: int) -> bytes:
    if f.kind in ("le", "be"):
        value &= (1 << (8 * f.width)) - 1
        data[f.pos:f.pos + f.width] = value.to_bytes(f.width, "little" if f.kind == "le" else "big")
        return bytes(data)
    if f.kind == "varint":
        value &= (1 << 64) - 1
        out = bytearray()
        while True:
            b = value & 0x7F
            value >>= 7
            out.append(b | (0x80 if value else 0))
            if not value:
                break
        return bytes(data[:f.pos] + out + data[f.pos + f.width:])
    return bytes(data[:f.pos] + str(value).encode() + data[f.pos + f.width:])  # digits


def _field_value(rng: random.Random, data: bytes, f: Field) -> int:
    old = 0
    if f.kind in ("le", "be"):
        old = int.from_bytes(data[f.pos:f.pos + f.width], "little" if f.kind == "le" else "big")
    elif f.kind == "digits":
        old = int(data[f.pos:f.pos + f.width] or b"0")
    choice = rng.random()
    if choice < 0.5:
        return rng.choice(INTERESTING)
    if choice < 0.8:
        return max(0, old + rng.choice((-2, -1, 1, 2, len(data), -old, old)))
    return len(data) - f.pos + rng.randint(-4, 4)


def _nest(rng: random.Random, data: bytes, at: int) -> bytes:
    """Insert a deeply nested container at ``at``, in the syntax of the input's format."""
    n = rng.choice((64, 1000, 10_000, 100_000, 300_000))
    head = data[:8]
    if head.startswith(b"\x93NUMPY"):
        blob = b"(" * n + b")" * n
    elif head.startswith(b"GGUF"):
        blob = (struct.pack("<IQ", 9, 1)) * min(n, 20_000) + struct.pack("<IQ", 4, 0)
    elif head[:1] == b"\x80" or head.startswith(b"PK"):
        blob = rng.choice((b"(" * n, b"]" * n + b"a" * (n - 1), b"}" * n, b"(" * n + b"t" * n,
                           b"N" * n, b"\x94" * n))
    elif len(data) > 9 and data[8:9] == b"{":
        blob = b'"x":' + b"[" * n + b"]" * n + b","
    else:  # protobuf: nested length-delimited fields (graph > node > attribute > graph ...)
        blob = b""
        for _ in range(min(n, 5000)):
            blob = b"\x0a" + _enc_varint(len(blob)) + blob
    return data[:at] + blob + data[at:]


def _enc_varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _wrap_zip(data: bytes, depth: int, compress: bool) -> bytes:
    """``data`` as the only member of a zip, ``depth`` times over (nested archives)."""
    for i in range(depth):
        buf = io.BytesIO()
        method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
        with zipfile.ZipFile(buf, "w", method) as z:
            z.writestr(f"archive/data/{i}" if i else "archive/data.pkl", data)
        data = buf.getvalue()
    return data


_BOMBS: dict[int, bytes] = {}


def bomb(mib: int = 16) -> bytes:
    """A zip whose one deflated member inflates 1000x (a data.pkl of ``mib`` MiB of zeros)."""
    if mib not in _BOMBS:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("archive/data.pkl", b"\x80\x02" + b"\x00" * (mib << 20))
        _BOMBS[mib] = buf.getvalue()
    return _BOMBS[mib]


MUTATORS = ("bitflip", "bytes", "truncate", "splice", "field", "duplicate", "delete", "insert",
            "nest", "wrap")


def mutate(rng: random.Random, data: bytes, others: list[bytes], *, which: str | None = None,
           max_size: int = 2 << 20) -> tuple[str, bytes]:
    """One structural mutation of ``data`` (others: splice partners). Returns (mutator, bytes)."""
    which = which or rng.choice(MUTATORS)
    cuts, fields = boundaries(data)
    n = len(data)
    near = lambda: min(n, max(0, rng.choice(cuts) + rng.randint(-3, 3))) if cuts else rng.randint(0, n)
    if which == "bitflip" or n == 0:
        out = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 4, 16))):
            if out:
                p = near() if rng.random() < 0.5 else rng.randrange(len(out))
                p = min(p, len(out) - 1)
                out[p] ^= 1 << rng.randrange(8)
        return "bitflip", bytes(out)
    if which == "bytes":
        out = bytearray(data)
        p = min(near(), n - 1)
        for i in range(rng.randint(1, 8)):
            if p + i < n:
                out[p + i] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        return "bytes", bytes(out)
    if which == "truncate":
        return "truncate", data[:near()]
    if which == "splice" and others:
        other = rng.choice(others)
        ocuts, _ = boundaries(other)
        a = near()
        b = rng.choice(ocuts) if ocuts else rng.randint(0, len(other))
        return "splice", (data[:a] + other[b:])[:max_size]
    if which == "field" and fields:
        f = rng.choice(fields)
        return "field", _set_field(bytearray(data), f, _field_value(rng, data, f))
    if which == "duplicate" and len(cuts) > 2:
        a, b = sorted(rng.sample(cuts, 2))
        at = rng.choice(cuts)
        times = rng.choice((1, 1, 2, 16))
        return "duplicate", (data[:at] + data[a:b] * times + data[at:])[:max_size]
    if which == "delete" and len(cuts) > 2:
        a, b = sorted(rng.sample(cuts, 2))
        return "delete", data[:a] + data[b:]
    if which == "insert":
        at = near()
        return "insert", data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))) + data[at:]
    if which == "nest":
        return "nest", _nest(rng, data, near())[:max_size + (3 << 20)]
    if which == "wrap":
        if rng.random() < 0.02:
            return "wrap", bomb(16)
        return "wrap", _wrap_zip(data, rng.choice((1, 2, 8, 20)), rng.random() < 0.5)
    return mutate(rng, data, others, which="bitflip")


# -------------------------------------------------------------------------------------------------
# Where inputs are written (the parsers take paths), and the exercise

class Workspace:
    """A folder for one worker's inputs. ONNX seeds with external data get their data files
    copied next to the input, so that mutated external references resolve against them."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._dirs: dict[Path, Path] = {}

    def path_for(self, seed: Path, data: bytes) -> Path:
        folder = seed.parent
        if folder.name.startswith("external_"):
            d = self._dirs.get(folder)
            if d is None:
                d = self.root / folder.name
                if d.exists():
                    shutil.rmtree(d)
                shutil.copytree(folder, d)
                self._dirs[folder] = d
            target = d / seed.name
        else:
            # Its own folder: the scanner looks for .onnx models next to a file and one folder up
            # (ONNX external data), so no input may sit in the parent of another input's folder.
            plain = self.root / "plain"
            plain.mkdir(exist_ok=True)
            target = plain / ("input" + seed.suffix)
        target.write_bytes(data)
        return target


def _touch(arr) -> None:
    """Touch the first and last element: proves the view's bounds without copying it."""
    if getattr(arr, "size", 0):
        idx0 = (0,) * arr.ndim
        idx1 = (-1,) * arr.ndim
        arr[idx0]
        arr[idx1]


def import_all() -> None:
    """Import tensorscope, its scanner and every parser module."""
    import importlib
    import pkgutil

    import tensorscope
    import tensorscope.parsers
    import tensorscope.scanning  # noqa: F401
    for mod in pkgutil.iter_modules(tensorscope.parsers.__path__):
        importlib.import_module(f"tensorscope.parsers.{mod.name}")


def warm() -> None:
    """Import every module the exercise may reach (parsers are imported lazily): an audit hook
    armed after this sees only what the input causes."""
    import_all()
    for p in sorted(FIXTURES.rglob("*")):
        if p.is_file() and p.suffix != ".py":
            try:
                exercise(p)
            except Exception:
                pass


def exercise(path: str | os.PathLike, against: str | os.PathLike | None = None) -> str:
    """Open, read every tensor, open a zip of pickles again in listing mode (what inspect and
    diff open: the compiled torch step's ``infos``, the zip scan's ``records``), diff against
    ``against`` (the seed the input was mutated from: the diff's compiled kernel over every pair
    of values; the fuzzers pass it, None skips the diff), scan. Returns "ok", "error" (a TensorscopeError on open) or
    "ok+" (opened, some tensor refused). Any other exception propagates: that is a bug, and so
    is a file that open() rejects and scan reports clean (an AssertionError)."""
    import tensorscope
    from tensorscope import TensorscopeError

    outcome = "ok"
    try:
        with tensorscope.open(path) as model:
            for t in model.tensors:
                try:
                    _touch(model.read(t.name))
                except TensorscopeError:
                    outcome = "ok+"
    except TensorscopeError:
        outcome = "error"
    if outcome != "error" and model.format in ("torch-zip", "torchscript", "pt2"):
        # listing mode changes what a zip of pickles keeps (other formats ignore it)
        with tensorscope.open(path, listing=True) as light:
            assert len(light.tensors) == len(model.tensors), (path, "listing differs")
    if outcome != "error" and against is not None:
        _diff(path, against)
    report = tensorscope.scan(path)
    assert isinstance(report.findings, list)
    # The invariant of issue 14: whatever open() rejects, scan never calls clean (a truncated or
    # crafted file must fail a CI gate, whatever the byte-level view saw).
    if outcome == "error" and report.files:
        assert report.exit_code() == 1, (path, [str(f) for f in report.findings[:3]])
    return outcome


def _diff(a, b) -> None:
    """`tensorscope diff` of two files (values compared: the compiled kernel runs); a
    TensorscopeError is an answer (either side may be refused)."""
    from tensorscope import TensorscopeError
    from tensorscope.diffing import diff_models
    try:
        result = diff_models(os.fspath(a), os.fspath(b))
    except TensorscopeError:
        return
    assert isinstance(result.entries, list)


def exercise_bytes(target: str, data: bytes) -> str:
    """The in-memory harnesses: the pickle VM, the zip reader, a torch zip in listing mode and
    the diff kernel on their own."""
    from tensorscope import TensorscopeError
    from tensorscope.source import ByteSource

    if target == "selftest_signal":
        import signal
        os.kill(os.getpid(), signal.SIGSEGV)
    if target == "selftest_hang":
        import time
        time.sleep(3600)
    if target == "listing":
        return _listing_bytes(data)
    if target == "diffkernel":
        return _diffkernel_bytes(data)
    if target == "pickle_vm":
        from tensorscope.parsers import pickle_vm
        try:
            r = pickle_vm.run(data)
        except TensorscopeError:
            return "error"
        return "ok" if r.error is None else "ok+"
    if target == "zipfmt":
        from tensorscope.parsers import zip_reader
        src = ByteSource.from_bytes(data, "fuzz.zip")
        try:
            archive = zip_reader.read_zip(src)
        except TensorscopeError:
            return "error"
        outcome = "ok"
        for m in archive.members:
            try:
                archive.read_bytes(m, max_size=64 << 20)
                archive.verify_crc(m, max_size=64 << 20)
            except TensorscopeError:
                outcome = "ok+"
        return outcome
    raise ValueError(target)


IN_MEMORY = ("pickle_vm", "zipfmt", "listing", "diffkernel") + SELFTESTS


def _listing_bytes(data: bytes) -> str:
    """A torch zip opened for listing from memory, its records held to the Python steps'."""
    from tensorscope import TensorscopeError, diffing, formats
    from tensorscope.parsers import pickle_vm, zipfmt
    from tensorscope.source import ByteSource

    def picture():
        try:
            with formats.open_model_source(ByteSource.from_bytes(data, "fuzz.pt"), "fuzz.pt",
                                           listing=True) as m:
                return [t.to_dict() for t in m.tensors], sorted(a.kind for a in
                                                                m.evidence.anomalies)
        except TensorscopeError as e:
            return str(e)
    got = picture()
    saved = pickle_vm._STEP, zipfmt._SCAN, diffing._KERNEL
    pickle_vm._STEP = zipfmt._SCAN = None
    try:
        want = picture()
    finally:
        pickle_vm._STEP, zipfmt._SCAN, diffing._KERNEL = saved
    assert got == want, "the compiled listing differs from the Python one"
    return "error" if isinstance(got, str) else "ok"


# the kernel's codes and the dtypes they read (lowrank.STORED_CODES; 't': through a table)
_KERNEL_DTYPES = {"e": "float16", "b": "bfloat16", "f": "float32", "d": "float64", "c": "int8",
                  "B": "uint8", "h": "int16", "i": "int32", "E": "float8_e5m2",
                  "F": "float8_e4m3fn", "t": "float8_e4m3fnuz"}


def _route(tag: str) -> int:
    """A distinct branch per kernel route (see `_diffkernel_bytes`)."""
    if tag == "e": return 1  # noqa: E701
    if tag == "b": return 2  # noqa: E701
    if tag == "f": return 3  # noqa: E701
    if tag == "d": return 4  # noqa: E701
    if tag == "c": return 5  # noqa: E701
    if tag == "B": return 6  # noqa: E701
    if tag == "h": return 7  # noqa: E701
    if tag == "i": return 8  # noqa: E701
    if tag == "E": return 9  # noqa: E701
    if tag == "F": return 10  # noqa: E701
    if tag == "t": return 11  # noqa: E701
    if tag == "odd": return 12  # noqa: E701
    if tag == "even": return 13  # noqa: E701
    if tag == "short": return 14  # noqa: E701
    if tag == "block": return 15  # noqa: E701
    if tag == "long": return 16  # noqa: E701
    if tag == "v4": return 17  # noqa: E701
    if tag == "portable": return 18  # noqa: E701
    if tag == "same": return 19  # noqa: E701
    return 20


def _diffkernel_bytes(data: bytes) -> str:
    """`_diffkernel.stats` and ``equal`` on two pieces cut from ``data``: byte 0 picks the codes,
    byte 1 the offsets of both pieces (any alignment), byte 2 the route (AVX-512 or portable) and
    the tolerances; the rest is both pieces' bytes. Held to an aligned copy and to numpy."""
    import ml_dtypes  # noqa: F401 (the dtypes by name)
    import numpy as np

    from tensorscope import diffing
    k = diffing._KERNEL
    if k is None or len(data) < 3:
        return "ok"
    codes = sorted(_KERNEL_DTYPES)
    ca, cb = codes[data[0] % 11], codes[(data[0] // 11) % 11]
    da, db = np.dtype(_KERNEL_DTYPES[ca]), np.dtype(_KERNEL_DTYPES[cb])
    off_a, off_b = data[1] & 7, data[1] >> 5
    body = data[3:]
    n = len(body) // (da.itemsize + db.itemsize)
    a = np.frombuffer(body[:n * da.itemsize], da)
    b = np.frombuffer(body[n * da.itemsize:n * (da.itemsize + db.itemsize)], db)
    table = lambda dt: np.arange(256, dtype=np.uint8).view(dt).astype(np.float64).tobytes()  # noqa: E731
    ta, tb = (table(da) if ca == "t" else b""), (table(db) if cb == "t" else b"")
    atol, rtol = ((1e-8, 1e-5), (0.0, 0.0), (1.0, 0.5), (0.0, 1e-3))[(data[2] >> 1) & 3]

    def at(arr, off):
        raw = bytearray(off + arr.nbytes)
        raw[off:] = arr.tobytes()
        return memoryview(raw)[off:]
    # The C code is not instrumented (gcc has no libFuzzer coverage): one Python branch per
    # route of the kernel (code, alignment, length class, AVX-512 or not) gives libFuzzer an
    # edge to keep an input for each.
    for tag in (ca, cb, "odd" if (off_a | off_b) & 1 else "even",
                "short" if n < 16 else "block" if n <= 512 else "long",
                "v4" if data[2] & 1 else "portable", "same" if ca == cb else "mixed"):
        _route(tag)
    was = k.avx512(bool(data[2] & 1))
    try:
        want = k.stats(a.tobytes(), ca, b.tobytes(), cb, atol, rtol, ta, tb)
        got = k.stats(at(a, off_a), ca, at(b, off_b), cb, atol, rtol, ta, tb)
    finally:
        k.avx512(was)
    assert got == want, ("an unaligned piece gave other figures", ca, cb, off_a, off_b)
    assert k.equal(at(a, off_a), a.tobytes())
    # The rank test's gather (positions every `step` elements from `first`, the piece at element
    # `lo` of its tensor), outputs at odd addresses: the figures unchanged, the copies numpy's
    # take (`diffing.take`, the twin); a position one past the piece is refused.
    step, first, lo = 1 + (data[2] >> 3), data[1] % max(n, 1), int.from_bytes(data[:3], "little")
    pos = np.arange(first, n, step, dtype=np.int64) + lo
    out_a, out_b = bytearray(pos.size * da.itemsize + 1), bytearray(pos.size * db.itemsize + 3)
    oa, ob = memoryview(out_a)[1:], memoryview(out_b)[3:]
    was = k.avx512(bool(data[2] & 1))
    try:
        gathered = k.stats(at(a, off_a), ca, at(b, off_b), cb, atol, rtol, ta, tb,
                           at(pos, off_b), lo, oa, ob)
        try:
            k.stats(a.tobytes(), ca, b.tobytes(), cb, atol, rtol, ta, tb,
                    np.array([lo + n], np.int64), lo, bytearray(da.itemsize),
                    bytearray(db.itemsize))
            raise AssertionError("a position past the piece was taken")
        except ValueError:
            pass
    finally:
        k.avx512(was)
    assert gathered == want, ("the gather changed the figures", ca, cb)
    if gathered is not None:
        idx = pos - lo
        assert bytes(oa) == a.view(np.uint8).reshape(n, da.itemsize)[idx].tobytes(), "gather a"
        assert bytes(ob) == b.view(np.uint8).reshape(n, db.itemsize)[idx].tobytes(), "gather b"
    if want is None:
        return "ok+"
    with np.errstate(all="ignore"):
        x, y = a.astype(np.float64), b.astype(np.float64)
        d = np.abs(x - y)
        assert np.isfinite(x).all() and np.isfinite(y).all(), "a NaN or Inf reached the figures"
        assert want[5] == (d.max() if n else 0.0), ("max_abs", ca, cb)
        assert want[8] == int((d > atol + np.abs(y) * rtol).sum()), ("mismatched", ca, cb)
    return "ok"


def crc(data: bytes) -> str:
    return f"{zlib.crc32(data):08x}"


# -------------------------------------------------------------------------------------------------
# atheris (libFuzzer) entry point shared by fuzz/fuzz_<target>.py

def atheris_main(target: str) -> None:
    """Run libFuzzer on one target: coverage-guided, with `mutate` as a structure-aware custom
    mutator half of the time. The first positional argument that is a folder is the corpus; an
    empty corpus is seeded with the target's fixtures."""
    import sys
    import tempfile

    import atheris

    with atheris.instrument_imports(include=["tensorscope"]):
        import_all()
    # this module's in-memory harnesses too (the routes of the C entry points they drive)
    for fn in (_listing_bytes, _diffkernel_bytes, _route):
        atheris.instrument_func(fn)
    # libFuzzer's convention: a folder (or a path not made yet) is a corpus, a file is one input to run
    corpora = [a for a in sys.argv[1:] if not a.startswith("-") and not os.path.isfile(a)]
    for d in corpora:
        os.makedirs(d, exist_ok=True)
        if not os.listdir(d):
            for i, (_, b) in enumerate(seed_bytes(target)):
                Path(d, f"seed-{i:03d}").write_bytes(b)
    pool = [b for _, b in seed_bytes(target)]
    ws = Workspace(tempfile.mkdtemp(prefix=f"tensorscope-atheris-{target}-"))
    seed_path = seeds(target)[0]

    def test_one_input(data: bytes) -> None:
        if target in IN_MEMORY:
            exercise_bytes(target, data)
        else:
            exercise(ws.path_for(seed_path, data), against=seed_path)

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if rng.random() < 0.5:
            return atheris.Mutate(data, max_size)
        return mutate(rng, data, pool)[1][:max_size]

    argv = list(sys.argv)
    dictionary = Path(__file__).resolve().parent / "dicts" / f"{target}.dict"
    if dictionary.exists() and not any(a.startswith("-dict=") for a in argv):
        argv.append(f"-dict={dictionary}")   # the format's magic, opcodes and field tags
    atheris.Setup(argv, test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()
