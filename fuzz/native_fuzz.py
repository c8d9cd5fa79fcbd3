#!/usr/bin/env python3
"""A bounded fuzz of every C entry point, for the sanitizer job (`.ci/sanitize.sh`) and by hand.

Each round picks one entry and one mutated input and holds the C to its Python twin:

- ``listing``: a mutated torch zip opened with ``listing=True`` (`_zipscan.scan`, ``records``,
  ``exact``, ``distinct``; `_torchstep.tensor`, ``infos``, ``is_flat``), its records compared
  with the same open with the compiled steps off;
- ``torch_step``: a mutated ``data.pkl`` run by the pickle VM with the real resolver of its
  archive (the step's own storage path), compiled against the Python step;
- ``zipscan``: the zip reader on a mutated archive, compiled against the Python loop, plus
  ``exact``/``records``/``distinct`` over its members;
- ``diffkernel``: every dtype code, aligned and at odd addresses, random lengths and bit
  patterns (NaN, Inf, subnormals), the AVX-512 pass and the portable loop, against numpy;
- ``stheader``: a mutated safetensors file's header (`_stheader.header` against `_fast` after
  ``json.loads``), the rows and groups of what it lists (`_jsonrows`, `_groupscan` against the
  Python loops), and a mutated index of those names (`_stheader.index_map` against the parse).

Any difference from the twin or any exception outside `TensorscopeError` is a finding: its input
is written to ``--out`` and the run fails. Under the sanitizer build, any report aborts the run.

Usage: python fuzz/native_fuzz.py --seconds 60 [--seed N] [--entries listing,diffkernel]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import random
import sys
import time
import traceback
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzzlib  # noqa: E402

ENTRIES = ("listing", "torch_step", "zipscan", "diffkernel", "stheader")


@contextlib.contextmanager
def _compiled(on: bool):
    """The compiled steps on (as built) or off (the Python twins)."""
    from tensorscope import diffing
    from tensorscope.parsers import pickle_vm, zipfmt
    saved = pickle_vm._STEP, zipfmt._SCAN, diffing._KERNEL
    if not on:
        pickle_vm._STEP = zipfmt._SCAN = diffing._KERNEL = None
    try:
        yield
    finally:
        pickle_vm._STEP, zipfmt._SCAN, diffing._KERNEL = saved


def _picture(data: bytes, listing: bool):
    from tensorscope import TensorscopeError, formats
    from tensorscope.source import ByteSource
    try:
        with formats.open_model_source(ByteSource.from_bytes(data, "fuzz.pt"), "fuzz.pt",
                                       listing=listing) as m:
            return ("ok", [(t.name, t.dtype, t.shape, t.stride, t.storage_offset, t.byte_offset,
                            t.nbytes, t.storage_key, t.storage_nbytes, t.role, dict(t.extras))
                           for t in m.tensors],
                    sorted((a.kind, a.message) for a in m.evidence.anomalies))
    except TensorscopeError as e:
        return ("error", type(e).__name__, str(e))


def run_listing(rng: random.Random, data: bytes) -> None:
    listing = rng.random() < 0.8
    with _compiled(True):
        got = _picture(data, listing)
    with _compiled(False):
        want = _picture(data, listing)
    assert got == want, ("listing" if listing else "full open", got, want)


def _pickle_member(data: bytes) -> tuple[str, bytes] | None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            name = next((n for n in z.namelist() if n.endswith("/data.pkl")), None)
            return (name, z.read(name)) if name else None
    except Exception:   # noqa: BLE001 - Python's zipfile on a seed: not what is tested
        return None


def run_torch_step(rng: random.Random, archive: bytes, pool: list[bytes]) -> None:
    from tensorscope import TensorscopeError
    from tensorscope.parsers import pickle_vm, torch_pickle, torch_zip, zip_reader
    from tensorscope.source import ByteSource
    member = _pickle_member(archive)
    if member is None:
        return
    _, pkl = member
    for _ in range(rng.choice((1, 1, 2, 3))):
        _, pkl = fuzzlib.mutate(rng, pkl, pool)
    recording = rng.random() < 0.3

    def once():
        arc = zip_reader.read_zip(ByteSource.from_bytes(archive))
        prefix = arc.torch_prefix()
        records = torch_zip.data_records(arc, prefix)
        load, storages = torch_zip.make_storage_resolver(arc, prefix, records=records)
        try:
            r = pickle_vm.run(pkl, persistent_load=load, hooks=torch_pickle.rebuild_hooks(),
                              file="f", member="m", record_calls=recording)
        except TensorscopeError as e:
            return ("raised", type(e).__name__, str(e))
        return (r.opcodes, r.end, None if r.error is None else (str(r.error), r.error.offset),
                [(g.module, g.name, g.pos) for g in r.globals], sorted(storages))
    with _compiled(True):
        got = once()
    saved = pickle_vm._STEP
    pickle_vm._STEP = None
    try:
        want = once()
    finally:
        pickle_vm._STEP = saved
    assert got == want, (got, want)


def run_zipscan(rng: random.Random, data: bytes) -> None:
    from tensorscope import TensorscopeError
    from tensorscope.parsers import torch_zip, zip_reader, zipfmt
    from tensorscope.source import ByteSource

    def once():
        try:
            arc = zip_reader.read_zip(ByteSource.from_bytes(data, "fuzz.zip"))
        except TensorscopeError as e:
            return ("error", str(e)), None
        return ([(m.name, m.raw_name, m.header_offset, m.data_offset, m.size, m.crc32, m.error)
                 for m in arc.members], sorted(a.kind for a in arc.anomalies)), arc
    with _compiled(True):
        got, arc = once()
    with _compiled(False):
        want, _ = once()
    assert got == want, (got, want)
    if arc is None or zipfmt._SCAN is None:
        return
    members = list(arc.members)
    visible = rng.randrange(len(members) + 2) - 1
    zipfmt._SCAN.exact(members, visible)
    zipfmt._SCAN.distinct(members, visible, rng.random() < 0.5)
    start = rng.choice(["", "a/", "archive/data/", members[0].name[:5] if members else "x"])
    if start.isascii():
        zipfmt._SCAN.records(members, visible, start, torch_zip._Record)


def _records_picture(got):
    if got is None:
        return None
    tensors, meta = got
    return [(t.name, t.dtype, t.shape, t.stride, t.byte_offset, t.nbytes, t.file, t.path,
             dict(t.extras)) for t in tensors], meta


def run_stheader(rng: random.Random, data: bytes, pool: list[bytes]) -> None:
    import json
    import struct

    from tensorscope import TensorscopeError, grouping, model
    from tensorscope.parsers import safetensors as sf
    from tensorscope.parsers import sharded
    if len(data) < 8:
        return
    (n,) = struct.unpack_from("<Q", data)
    raw = data[8:8 + min(n, len(data) - 8)]
    for _ in range(rng.choice((0, 1, 1, 2))):
        _, raw = fuzzlib.mutate(rng, raw, pool)
    start = rng.choice((8 + len(raw), 0, 2 ** 64 - 9))
    got = sf._compiled(raw, "f.safetensors", start)
    if got is not None:   # the Python path must read it, and read the same
        text = raw.decode("utf-8")
        want = sf._fast(sf._loads(text, "f.safetensors", False), text, "f.safetensors", start)
        assert _records_picture(got) == _records_picture(want), "header"
        records = got[0]
        assert model.json_texts(records) == model._json_texts(records), "rows"
        a, b = grouping.GroupCollector(), grouping.GroupCollector()
        a.add_tensors(list(records))
        b._add_tensors(records)
        assert list(a._groups.items()) == list(b._groups.items()), "groups"
        names = [t.name for t in records]
    else:
        names = [f"n.{i}" for i in range(rng.randrange(1, 6))]
    index = json.dumps({"metadata": {"total_size": rng.randrange(100)},
                        "weight_map": {k: f"s{rng.randrange(3)}" for k in names}},
                       ensure_ascii=rng.random() < 0.5).encode()
    for _ in range(rng.choice((0, 1, 2))):
        _, index = fuzzlib.mutate(rng, index, [index])
    cols = sharded._compiled_index(index)
    if cols is not None:
        try:
            wm, meta, dups = sharded._parse_index(index, "i.json")
        except TensorscopeError as e:
            raise AssertionError(f"index_map took an index the parse refuses: {e}") from None
        assert list(cols[0]) == list(wm) and cols[1] == list(wm.values()) and not dups, "index"


_CODES = {"e": "float16", "b": "bfloat16", "f": "float32", "d": "float64", "c": "int8",
          "B": "uint8", "h": "int16", "i": "int32", "E": "float8_e5m2", "F": "float8_e4m3fn",
          "t": "float8_e4m3fnuz"}


def run_diffkernel(rng: random.Random) -> None:
    import ml_dtypes  # noqa: F401 (the dtypes by name)
    import numpy as np

    from tensorscope import diffing
    k = diffing._KERNEL
    if k is None:
        return
    code = rng.choice(sorted(_CODES))
    other = code if rng.random() < 0.7 else rng.choice(sorted(_CODES))
    dta, dtb = np.dtype(_CODES[code]), np.dtype(_CODES[other])
    n = rng.choice((0, 1, 3, 15, 16, 17, 63, 511, 512, 513, rng.randrange(1, 5000)))
    # random bit patterns (NaN, Inf, subnormals, both zeros) or small values
    def side(dt):
        if rng.random() < 0.5:
            return np.frombuffer(rng.randbytes(n * dt.itemsize), dt).copy()
        return (np.asarray([rng.gauss(0, 4) for _ in range(n)]).astype(dt))
    a, b = side(dta), side(dtb)
    table = lambda dt: np.arange(256, dtype=np.uint8).view(dt).astype(np.float64).tobytes()  # noqa: E731
    ta = table(dta) if code == "t" else b""
    tb = table(dtb) if other == "t" else b""
    atol, rtol = rng.choice(((1e-8, 1e-5), (0.0, 0.0), (1.0, 0.5)))

    def at(arr, off):
        raw = bytearray(off + arr.nbytes + rng.randrange(0, 9))
        raw[off:off + arr.nbytes] = arr.tobytes()
        return memoryview(raw)[off:off + arr.nbytes]
    with np.errstate(all="ignore"):
        _diff_both_ways(k, np, rng, a, b, code, other, ta, tb, atol, rtol, at, n)
        if code != "t" and other != "t" and n:
            _spectrum_twin(k, np, rng, a, b, code, other, at, n)
    assert k.equal(at(a, 3), a.tobytes()) is True


def _spectrum_twin(k, np, rng, a, b, code, other, at, n) -> None:
    """`spectrum` (the rank test's first step in C) on the same bytes cut into an s x c sample,
    at any alignment: -1 exactly when a value is not finite (or the Gram trace is not),
    otherwise what numpy computes of the same Gram matrix (its trace, its largest eigenvalues and
    the sum of the counted ones)."""
    s = rng.choice([d for d in range(1, n + 1) if n % d == 0])
    c = n // s
    unit = rng.choice((0.0, 2.0 ** -24, 2.0 ** -8))
    got = k.spectrum(at(a, rng.randrange(0, 8)), code, at(b, rng.randrange(0, 8)), other, s, c,
                     unit, rng.random() < 0.5)
    x, y = a.astype(np.float64).reshape(s, c), b.astype(np.float64).reshape(s, c)
    d = y - x
    gram = d @ d.T if s <= c else d.T @ d
    finite = bool(np.isfinite(x).all() and np.isfinite(y).all())
    total = float(np.trace(gram)) if finite else float("nan")
    if got == -1:
        assert not finite or not np.isfinite(total), ("spectrum -1 on finite values", code, s, c)
        return
    assert finite and np.isfinite(total), ("spectrum on values that are not finite", code, s, c)
    if got == 1:
        assert total > 0, ("full rank certified of a zero change", code, s, c)
        return
    got_total, _, r, top_sum, top = got
    scale = max(abs(total), 1e-300)
    assert abs(got_total - total) <= 1e-9 * scale, ("trace", code, s, c)
    sq = np.clip(np.linalg.eigvalsh(gram)[::-1], 0.0, None)
    assert 0 <= r <= min(s, c) and len(top) == min(r + 4, 12, s, c), ("count", code, s, c)
    assert all(x >= y for x, y in zip(top, top[1:])), ("not descending", code, s, c)
    assert np.all(np.abs(np.asarray(top) - sq[:len(top)]) <= 1e-9 * scale), ("top", code, s, c)
    assert abs(top_sum - float(sq[:r].sum())) <= 1e-9 * scale, ("top sum", code, s, c)


def _diff_both_ways(k, np, rng, a, b, code, other, ta, tb, atol, rtol, at, n) -> None:
    for avx in (False, True):
        was = k.avx512(avx)
        try:
            want = k.stats(a.tobytes(), code, b.tobytes(), other, atol, rtol, ta, tb)
            got = k.stats(at(a, rng.randrange(1, 8)), code, at(b, rng.randrange(0, 8)), other,
                          atol, rtol, ta, tb)
        finally:
            k.avx512(was)
        assert got == want, ("unaligned", code, other, n, avx)
        x, y = a.astype(np.float64), b.astype(np.float64)
        finite = bool(np.isfinite(x).all() and np.isfinite(y).all())
        if want is None:
            assert not finite or not np.isfinite((x * x).sum() + (y * y).sum()), (code, other)
            continue
        assert finite, ("a NaN or Inf reached the figures", code, other)
        d = np.abs(x - y)
        assert want[5] == (d.max() if n else 0.0), ("max_abs", code, other, avx)
        assert want[8] == int((d > atol + np.abs(y) * rtol).sum()), ("mismatched", code, other)
        assert want[7] == int(((y == 0) & (d != 0)).sum()), ("zero_ref", code, other)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--entries", default=",".join(ENTRIES))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "findings"))
    args = ap.parse_args(argv)
    entries = [e for e in args.entries.split(",") if e]
    rng = random.Random(args.seed)
    torch_zips = [b for _, b in fuzzlib.seed_bytes("torch_zip") if len(b) < 400_000]
    zips = [b for _, b in fuzzlib.seed_bytes("zipfmt")]
    pickles = [b for _, b in fuzzlib.seed_bytes("pickle_vm")]
    sts = [b for _, b in fuzzlib.seed_bytes("safetensors") if len(b) < 4_000_000]
    counts = dict.fromkeys(entries, 0)
    stop = time.monotonic() + args.seconds
    failures = 0
    while time.monotonic() < stop:
        entry = rng.choice(entries)
        data = b""
        try:
            if entry == "listing":
                data = rng.choice(torch_zips)
                for _ in range(rng.choice((1, 1, 2))):
                    _, data = fuzzlib.mutate(rng, data, torch_zips)
                run_listing(rng, data)
            elif entry == "torch_step":
                data = rng.choice(torch_zips)
                run_torch_step(rng, data, pickles)
            elif entry == "zipscan":
                data = rng.choice(zips)
                for _ in range(rng.choice((1, 1, 2))):
                    _, data = fuzzlib.mutate(rng, data, zips)
                run_zipscan(rng, data)
            elif entry == "stheader":
                data = rng.choice(sts)
                run_stheader(rng, data, sts)
            else:
                run_diffkernel(rng)
        except Exception as e:  # noqa: BLE001 - every other exception is the finding
            failures += 1
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            stem = f"native-{entry}-{fuzzlib.crc(data)}"
            (out / f"{stem}.bin").write_bytes(data)
            (out / f"{stem}.txt").write_text("".join(traceback.format_exception(e))[-6000:])
            print(f"native_fuzz: {entry}: {type(e).__name__}: {str(e)[:300]} "
                  f"(input saved as {out / stem}.bin)", flush=True)
        counts[entry] += 1
    print("native_fuzz: " + ", ".join(f"{e} {c}" for e, c in counts.items())
          + f" inputs in {args.seconds:.0f} s; {failures} findings", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
