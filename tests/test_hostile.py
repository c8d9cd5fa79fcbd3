"""Hostile-input regressions: each test is one input the fuzzers (`fuzz/run_long.py`,
`tests/test_fuzz.py`) or a review found to break an invariant of issue #9, rebuilt here byte by
byte, with the exact outcome now expected.

Invariants: any input gives a `ModelFile` or a `TensorscopeError`; `scan` never raises; work and
memory are bounded by the input's size, never by a number the file claims; nothing executes.
"""
from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

import tensorscope
from tensorscope import FormatError, TensorscopeError
from helpers import PEAK_KB

ROOT = Path(__file__).resolve().parent.parent


def npy(header: bytes, body: bytes = b"") -> bytes:
    """A version 1.0 .npy: magic, header padded with spaces to a multiple of 64, body."""
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + body


def exercise(path: Path) -> list[str]:
    """open + read every tensor + scan; returns the errors met (TensorscopeError messages)."""
    errors = []
    try:
        with tensorscope.open(path) as model:
            for t in model.tensors:
                try:
                    model.read(t.name)
                except TensorscopeError as e:
                    errors.append(str(e))
    except TensorscopeError as e:
        errors.append(str(e))
    tensorscope.scan(path)  # never raises
    return errors


# -------------------------------------------------------------------------------------------------
# Found by fuzz/run_long.py

def test_empty_npy_with_a_dimension_numpy_cannot_index(tmp_path):
    # run_long, numpy target, "field" mutator on fixtures/formats/empty.npy: the shape (0, 3)
    # became (0, 2^64 - 1). numel is 0, so no bytes are needed, but np.empty refused the shape
    # with a raw ValueError from reader.strided_view.
    p = tmp_path / "empty_giant.npy"
    p.write_bytes(npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (0, 18446744073709551615), }"))
    with tensorscope.open(p) as model:
        (t,) = model.tensors
        assert t.shape == (0, 18446744073709551615)
        with pytest.raises(FormatError) as err:
            model.read(t.name)
    assert str(err.value).startswith(
        f"npy: {p}: tensor '<root>' of shape (0, 18446744073709551615) cannot be viewed: ")
    tensorscope.scan(p)


@pytest.mark.perf  # machine-dependent bound: its own step of .ci/run
def test_million_deep_list_pickle_lists_in_linear_time(tmp_path):
    # test_fuzz worst case "pickle 1e6-deep list": PROTO 2, EMPTY_LIST x 1e6, APPEND x (1e6 - 1),
    # STOP (3 MB). The VM runs it in linear time, but torch_pickle.named_tensors copied the path
    # tuple at every level: O(depth^2), over two minutes for open and again for scan (20k deep
    # took 2.4 s, 40k 8.2 s). Containers deeper than 1000 levels are no longer expanded.
    n = 1_000_000
    p = tmp_path / "deep.pkl"
    p.write_bytes(b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b".")
    t0 = time.monotonic()
    with tensorscope.open(p) as model:
        assert model.format == "pickle"
        assert model.tensors == []
        assert model.metadata["opcodes"] == 2 * n + 1
    tensorscope.scan(p)
    assert time.monotonic() - t0 < 30  # ~3 s here; quadratic was > 120 s


@pytest.mark.perf  # machine-dependent bound: its own step of .ci/run
def test_wide_pickle_of_empty_containers_names_at_the_cost_of_the_vm():
    """fuzz "slow-legacy" (the nest mutator on a numpy pickle): 300,000 empty dicts held by one
    object made the naming walk six times the VM's cost (a stack entry and two path tuples per
    empty dict); scalars and empty containers hold no tensor and get no entry now. Measured as a
    ratio to the VM's own run of the same bytes, in one process."""
    from tensorscope.parsers import pickle_vm, torch_pickle
    n = 300_000
    for body in (b"]" + b"}" * n + b"e",                    # a list of empty dicts (APPENDS)
                 b"}" + b"".join(b"K\x00}s" for _ in range(n // 4)),   # a dict of them
                 b"c__main__\nX\n)\x81(" + b"}" * n + b"e"):   # a Call's APPENDS items
        data = b"\x80\x02" + body[:1] + b"(" + body[1:] + b"." if body[:1] == b"]" else \
            b"\x80\x02" + body + b"."
        t0 = time.perf_counter()
        result = pickle_vm.run(data, hooks=torch_pickle.rebuild_hooks())
        vm = time.perf_counter() - t0
        assert result.error is None, result.error
        t0 = time.perf_counter()
        assert list(torch_pickle.named_tensors(result.value)) == []
        assert time.perf_counter() - t0 < 4 * vm + 0.25


def test_module_state_with_a_key_that_is_not_a_string(tmp_path):
    # run_long, torch_zip target ("field" on fixtures/torch/module.pt) and legacy target
    # ("duplicate" on legacy_module.pt): an nn.Module-like state dict (it has _parameters and
    # _modules) with a key that is not a str (here the int 1; the fuzzer found a TensorRef and an
    # UnhashableKey) made torch_pickle._module_children call key.startswith: AttributeError.
    # PROTO 2, GLOBAL __main__.M, EMPTY_TUPLE, NEWOBJ, EMPTY_DICT, MARK,
    # "_parameters" {}, "_modules" {}, 1 None, SETITEMS, BUILD, STOP
    p = tmp_path / "module.pkl"
    p.write_bytes(b"\x80\x02c__main__\nM\n)\x81}("
                  b"X\x0b\x00\x00\x00_parameters}X\x08\x00\x00\x00_modules}K\x01Nub.")
    with tensorscope.open(p) as model:
        assert model.format == "pickle"
        assert model.tensors == []
    report = tensorscope.scan(p)
    assert [f.trigger for f in report.findings if f.trigger] == ["__main__.M"]


_PEAK_PROBE = """
import sys, time
import tensorscope
""" + PEAK_KB + """
base = peak_kb()
try:
    tensorscope.open(sys.argv[1])
except tensorscope.TensorscopeError as e:
    print(e, file=sys.stderr)
print((peak_kb() - base) // 1024)
"""


@pytest.mark.perf  # machine-dependent bound: its own step of .ci/run
def test_decompression_bomb_peaks_at_twice_its_output(tmp_path):
    # test_fuzz worst cases / run_long "wrap" mutator: a 65 KB zip whose deflated data.pkl
    # inflates to 64 MiB (PROTO 2 then zeros). zipfmt.read_bytes grew a bytearray by += and
    # copied it to bytes at the end, and each zlib call could build the whole output: the open
    # peaked at +192 MB (3x). Pieces of 1 MiB joined once: 2x (+128 MB).
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02" + b"\x00" * (64 << 20))
    p = tmp_path / "bomb.pt"
    p.write_bytes(buf.getvalue())
    assert p.stat().st_size < 70_000
    out = subprocess.run([sys.executable, "-c", _PEAK_PROBE, str(p)], capture_output=True,
                         text=True, timeout=120)
    assert out.stderr.strip().endswith("archive/data.pkl at byte 2: unknown opcode 0x00")
    assert int(out.stdout) < 160  # MB over the baseline; was 192


def test_deeply_nested_value_in_an_error_message(tmp_path):
    # run_long "nest" mutator on containers/legacy_views.pt: the legacy stream's protocol-version
    # pickle became a list nested 100,000 deep. The error message formatted it with repr(), which
    # raised RecursionError instead of the one-line FormatError. Messages now use errors.brief.
    magic = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little") + b"."
    depth = 100_000
    nested = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."
    p = tmp_path / "nested_version.pt"
    p.write_bytes(magic + nested)
    with pytest.raises(tensorscope.TensorscopeError) as e:
        tensorscope.open(p)
    assert "unsupported legacy protocol version [[[[...]]]]" in str(e.value)
    assert len(str(e.value).splitlines()) == 1


# run_long, target torch_zip (16 KB input, killed after 10 s): a fuzzed DEFLATE stream on which
# zlib, asked for the last 1,282 bytes before the cap, returns nothing and consumes nothing; the
# inflate loop in zipfmt spun forever. The raw stream, lzma-compressed and base64-encoded:
_STALLING_DEFLATE = "/Td6WFoAAATm1rRGAgAhARYAAAB0L+Wj4D+3AHNdAHYwPCCLhvRz6akCeKavE6rm2sNUfw8OcmkfGni19E99kkTfLmboIhakXqSpBlp/0yG2JYsUGKEyTjWC4vtosfOEQidcwyoFVyerNKu6jloAOx6fwmxJRFG4YKs7dQ9PT1j10LB5gD1fxjzK8ETCPcP/eAAAAEY6Mz9dqgAqAAGPAbh/AAB4EriWscRn+wIAAAAABFla"


@pytest.mark.perf  # machine-dependent bound: its own step of .ci/run
def test_deflate_stream_that_makes_no_progress_fails_fast():
    import base64
    import lzma

    from tensorscope.parsers import zip_inflate, zipfmt
    raw = memoryview(lzma.decompress(base64.b64decode(_STALLING_DEFLATE)))
    start = time.monotonic()
    with pytest.raises(ValueError, match="makes no progress"):
        for _ in zip_inflate._decompress(zipfmt.METHOD_DEFLATED, raw, 16777219, None, None):
            pass
    assert time.monotonic() - start < 10


def test_brief_prints_a_set_in_an_order_that_does_not_hang_on_hashing():
    """Globals hash by identity: a persistent id that is a frozenset holding one printed its items
    in memory-address order, so one error read two ways (found by the listing fuzzer)."""
    from tensorscope.errors import brief
    from tensorscope.parsers.pickle_values import Global
    frozen, plain = set(), set()
    for _ in range(20):   # new Globals each time: other addresses, other hashes
        items = [Global("torch", "FloatStorage", 1), 3, "cpu", "1"]
        frozen.add(brief(frozenset(items), 80))
        plain.add(brief(set(reversed(items)), 80))
    assert frozen == {"frozenset({Global(torch.FloatStorage), 3, '1', 'cpu'})"}
    assert plain == {"{Global(torch.FloatStorage), 3, '1', 'cpu'}"}
    assert brief(set()) == "set()" and brief(frozenset()) == "frozenset()"
    assert brief(set(range(5000))).startswith("{")   # large sets: not sorted, still bounded
