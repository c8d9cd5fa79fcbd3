"""Property tests over hostile input (issue #9): mutants of the real fixtures, for every parser.

Every input goes through ``tensorscope.open`` + ``read`` of every tensor (a zero-copy view whose
first and last elements are touched) + ``tensorscope.scan``, and must:

- end with a result or a `TensorscopeError` (never another exception); ``scan`` never raises;
- finish within a deadline (hypothesis ``deadline``, plus a hard SIGALRM check that interrupts a
  hang);
- execute nothing: an audit hook, armed around every exercise, fails on exec/compile/new
  imports/processes/sockets and on opening any path outside the input's folder;
- keep memory bounded: the worst cases (claimed sizes of 2^60 and 2^63, inflated length fields,
  deep nesting, a decompression bomb) run in a subprocess that reports its peak RSS growth
  (``VmHWM``; ``ru_maxrss`` is useless there, Linux carries the parent's peak across exec).

Mutations come from `fuzz/fuzzlib.py` (shared with `fuzz/run_long.py` and the atheris harnesses):
bit flips, truncation at every structural boundary, splices, length fields inflated or zeroed,
duplicated regions, deep nesting, nested/compressed archives.

CI runs a small derandomized profile (the whole file in well under 2 minutes on 2 cores); set
``TENSORSCOPE_FUZZ_EXAMPLES=N`` to draw N examples per property instead.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorscope
from tensorscope import TensorscopeError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fuzz"))
import fuzzlib  # noqa: E402
from helpers import audit  # noqa: E402

EXAMPLES = int(os.environ.get("TENSORSCOPE_FUZZ_EXAMPLES", "50"))
DEADLINE_S = 2.0     # hypothesis deadline per input (the target)
HARD_S = 20.0        # SIGALRM: an input still running after this is a hang, whatever the load
settings.register_profile(
    "tensorscope-fuzz", max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
FUZZ = settings.get_profile("tensorscope-fuzz")


# -------------------------------------------------------------------------------------------------
# The audit hook (same idea as tests/test_no_execution.py: hooks cannot be removed, so it is armed
# only around an exercise; modules are warmed up before, so any import it sees is the input's).

fuzzlib.warm()


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"input still running after {HARD_S} s")


def check(path: Path | None, *, target: str | None = None, data: bytes | None = None) -> str:
    """The exercise under the audit hook and the hard deadline; returns its outcome."""
    allowed = os.path.realpath(path.parent if path is not None else ROOT / "fuzz")
    armed = audit(allowed_dir=allowed, allow_ast_compile=True).__enter__()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HARD_S)
    t0 = time.monotonic()
    try:
        if target in fuzzlib.IN_MEMORY:
            outcome = fuzzlib.exercise_bytes(target, data)
        else:
            outcome = fuzzlib.exercise(path)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        armed.__exit__(None, None, None)   # asserts no forbidden event
    elapsed = time.monotonic() - t0
    assert outcome in ("ok", "ok+", "error")
    check.worst = max(getattr(check, "worst", 0.0), elapsed)
    return outcome


@pytest.fixture
def ws(tmp_path):
    return fuzzlib.Workspace(tmp_path)


def run_input(ws, target: str, seed: Path, data: bytes) -> str:
    if target in fuzzlib.IN_MEMORY:
        return check(None, target=target, data=data)
    return check(ws.path_for(seed, data))


SEEDS = {t: fuzzlib.seed_bytes(t) for t in fuzzlib.TARGETS}
OTHERS = {t: [b for _, b in SEEDS[t]] for t in fuzzlib.TARGETS}
ALL_BYTES = [b for t in fuzzlib.TARGETS for b in OTHERS[t]]


def _first_small(target: str) -> tuple[Path, bytes]:
    """The smallest seed of a target with a real structure (more than 2 cut points)."""
    cands = sorted(SEEDS[target], key=lambda pb: len(pb[1]))
    for p, b in cands:
        if len(fuzzlib.boundaries(b)[0]) > 4:
            return p, b
    return cands[0]


# -------------------------------------------------------------------------------------------------
# Properties

@pytest.mark.parametrize("target", fuzzlib.TARGETS)
@FUZZ
@given(data=st.data())
def test_mutants_give_a_model_or_a_tensorscope_error(ws, target, data):
    """Any stack of 1-3 structural mutations of any fixture of this parser."""
    seed, blob = data.draw(st.sampled_from(SEEDS[target]), label="seed")
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="rng"))
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        which = data.draw(st.sampled_from(fuzzlib.MUTATORS), label="mutator")
        _, blob = fuzzlib.mutate(rng, blob, OTHERS[target], which=which)
    run_input(ws, target, seed, blob)


@pytest.mark.parametrize("target", fuzzlib.TARGETS)
@FUZZ
@given(data=st.data())
def test_trusted_fields_inflated_or_zeroed(ws, target, data):
    """A length/count/offset field set to 0, 2^31, 2^32-1, 2^60, 2^63, the file size ±k ..."""
    seed, blob = data.draw(st.sampled_from(SEEDS[target]), label="seed")
    _, fields = fuzzlib.boundaries(blob)
    if not fields:
        return
    f = data.draw(st.sampled_from(fields), label="field")
    value = data.draw(st.one_of(st.sampled_from(fuzzlib.INTERESTING),
                                st.integers(0, 2**64 - 1),
                                st.integers(-8, 8).map(lambda k: max(0, len(blob) - f.pos + k))),
                      label="value")
    run_input(ws, target, seed, fuzzlib._set_field(bytearray(blob), f, value))


@FUZZ
@given(data=st.data())
def test_splices_across_formats(ws, data):
    """The head of one fixture glued to the tail of another, of any format, cut at boundaries."""
    target = data.draw(st.sampled_from([t for t in fuzzlib.TARGETS if t not in fuzzlib.IN_MEMORY]))
    seed, a = data.draw(st.sampled_from(SEEDS[target]), label="head")
    b = data.draw(st.sampled_from(ALL_BYTES), label="tail")
    ca, cb = fuzzlib.boundaries(a)[0], fuzzlib.boundaries(b)[0]
    blob = a[:data.draw(st.sampled_from(ca))] + b[data.draw(st.sampled_from(cb)):]
    run_input(ws, target, seed, blob)


def _truncation_cases():
    for target in fuzzlib.TARGETS:
        seed, blob = _first_small(target)
        yield pytest.param(target, seed, blob, id=f"{target}-{seed.name}")


@pytest.mark.parametrize("target,seed,blob", list(_truncation_cases()))
def test_truncated_at_every_structural_boundary(ws, target, seed, blob):
    """Cut at every boundary (and one byte either side) of one small fixture per parser."""
    cuts = fuzzlib.boundaries(blob)[0]
    points = sorted({max(0, min(len(blob), c + d)) for c in cuts for d in (-1, 0, 1)})
    budget = int(os.environ.get("TENSORSCOPE_FUZZ_CUTS", "150"))
    if len(points) > budget:  # evenly spread, always keeping both ends
        step = len(points) / budget
        points = sorted({points[int(i * step)] for i in range(budget)} | {points[0], points[-1]})
    outcomes = {run_input(ws, target, seed, blob[:p]) for p in points}
    # Truncations are refused somewhere (the VM keeps a partial result with its error: "ok+").
    assert outcomes & {"error", "ok+"}


NEST_DEPTHS = (1_000, 100_000, 1_000_000)


@pytest.mark.parametrize("target", [t for t in fuzzlib.TARGETS if t != "zipfmt"])
@pytest.mark.parametrize("depth", NEST_DEPTHS)
def test_deeply_nested_containers(ws, target, depth):
    """Nesting as each format spells it (pickle MARKs and lists, JSON arrays, npy tuples, GGUF
    arrays of arrays, protobuf sub-messages) at one structural point: no RecursionError."""
    seed, blob = _first_small(target)
    cuts = fuzzlib.boundaries(blob)[0]
    at = cuts[len(cuts) // 2]
    head = blob[:8]
    if head.startswith(b"\x93NUMPY"):
        nest = b"(" * depth + b")" * depth
    elif head.startswith(b"GGUF"):
        nest = b"\x09\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00" * min(depth, 100_000)
    elif head[:1] == b"\x80" or head.startswith(b"PK"):
        nest = b"]" * depth + b"a" * (depth - 1)
    elif blob[8:9] == b"{":
        nest = b'"x":' + b"[" * depth + b"]" * depth + b","
    else:
        nest = b""
        for _ in range(min(depth, 20_000)):
            nest = b"\x0a" + fuzzlib._enc_varint(len(nest)) + nest
    run_input(ws, target, seed, blob[:at] + nest + blob[at:])


@pytest.mark.parametrize("depth", (1, 7, 30))
@pytest.mark.parametrize("compress", (False, True), ids=("stored", "deflated"))
def test_archives_nested_in_archives(ws, depth, compress):
    seed, blob = SEEDS["torch_zip"][0]
    run_input(ws, "torch_zip", seed, fuzzlib._wrap_zip(blob, depth, compress))


def test_duplicated_members_and_central_directory(ws):
    """Every local header region of a torch zip duplicated in place (duplicate names, two
    records for one name, central directory entries pointing at either copy)."""
    seed, blob = _first_small("torch_zip")
    cuts = fuzzlib.zip_boundaries(blob)[0]
    starts = sorted({c for c in cuts if blob[c:c + 4] in (b"PK\x03\x04", b"PK\x01\x02")})
    for a, b in zip(starts, starts[1:]):
        run_input(ws, "torch_zip", seed, blob[:b] + blob[a:b] + blob[b:])


# -------------------------------------------------------------------------------------------------
# Memory: the worst cases, each in one subprocess that reports its maxrss growth

_MEMORY_PROBE = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {fuzz!r})
    import fuzzlib
    fuzzlib.import_all()  # not warm(): its own peak would hide the input's

    def peak_kb():  # VmHWM: this process image's peak RSS (ru_maxrss survives exec: the parent's)
        with open("/proc/self/status") as f:
            return int(next(l for l in f if l.startswith("VmHWM:")).split()[1])

    base = peak_kb()
    t0 = time.monotonic()
    outcome = fuzzlib.exercise(sys.argv[1])
    print(json.dumps({{"outcome": outcome, "seconds": time.monotonic() - t0,
                      "base_mb": base / 1024, "grew_mb": (peak_kb() - base) / 1024}}))
""")


def _worst_cases() -> dict[str, tuple[str, bytes]]:
    import struct
    cases = {}
    # BINUNICODE8 claiming 2^60 bytes, in a protocol 4 pickle.
    cases["pickle BINUNICODE8 2^60"] = ("x.pkl", b"\x80\x04\x8d" + struct.pack("<Q", 1 << 60) + b"ab.")
    cases["pickle BINBYTES8 2^63"] = ("x.pkl", b"\x80\x04\x8e" + struct.pack("<Q", 1 << 63) + b"ab.")
    cases["pickle FRAME 2^62"] = ("x.pkl", b"\x80\x04\x95" + struct.pack("<Q", 1 << 62) + b"N.")
    # safetensors header length 2^63.
    cases["safetensors header 2^63"] = ("x.safetensors", struct.pack("<Q", 1 << 63) + b'{"a":1}')
    # ONNX: ModelProto.graph (field 7) with a length varint of 2^62.
    cases["onnx length 2^62"] = ("x.onnx", b"\x08\x07\x3a" + fuzzlib._enc_varint(1 << 62) + b"\x0a\x00")
    # GGUF: one KV, an array of u8 claiming 2^60 items.
    cases["gguf array 2^60"] = ("x.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
                                + struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 0, 1 << 60))
    # npy: shape claiming 2^40 float64 (8 TiB), no data.
    cases["npy shape 2^40"] = ("x.npy", _npy(b"{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776,), }"))
    # zip: a stored data.pkl whose local and central sizes claim 4 GiB - 1.
    z = fuzzlib._wrap_zip(b"\x80\x02N.", 1, False)
    for f in fuzzlib.zip_boundaries(z)[1]:
        if z[f.pos - 18:f.pos - 14] == b"PK\x03\x04" or z[f.pos - 20:f.pos - 16] == b"PK\x01\x02":
            z = fuzzlib._set_field(bytearray(z), f, 0xFFFFFFFF)
    cases["zip declared size 2^32-1"] = ("x.pt", z)
    # A decompression bomb: 16 MiB of zeros deflated to ~16 KiB.
    cases["zip bomb 16 MiB"] = ("x.pt", fuzzlib.bomb(16))
    # Deep nesting: a million-deep list in a pickle.
    n = 1_000_000
    cases["pickle 1e6-deep list"] = ("x.pkl", b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b".")
    return cases


def _npy(header: bytes) -> bytes:
    import struct
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


WORST = _worst_cases()
MAX_GROWTH_MB = 200


@pytest.mark.perf  # machine-dependent bound: its own step of .ci/run
@pytest.mark.parametrize("name", list(WORST))
def test_worst_cases_stay_small_in_memory(tmp_path, name):
    fname, blob = WORST[name]
    p = tmp_path / fname
    p.write_bytes(blob)
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE.format(fuzz=str(ROOT / "fuzz")), str(p)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["grew_mb"] < MAX_GROWTH_MB, r
    assert r["seconds"] < 30, r
