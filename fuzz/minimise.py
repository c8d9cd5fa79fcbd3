#!/usr/bin/env python3
"""Shrink a fuzzing finding to a small input that fails the same way, and keep it as a
regression test.

    python fuzz/minimise.py fuzz/findings/crash-onnx-1a2b3c4d5e.bin [--seconds 300]

The finding's ``.json`` (written by `run_long.py`) names its target and seed; ``--target`` and
``--seed`` say so for an input from elsewhere (an atheris ``crash-<sha1>``). Each candidate runs
in a fresh process (``--run``), with a timeout, so that a segfault, an abort from a sanitizer or
a hang is an outcome like an exception: the failure's signature is (kind, exception type, the
innermost frame of ours), or the signal, or "timeout". Chunks are cut out while the signature
stays (delta debugging, coarse to fine), then bytes are zeroed where that keeps it.

The result goes to ``tests/fuzz_regressions/<target>-<crc>.bin`` with a ``.json`` (target, seed,
signature), which `tests/test_fuzz_regressions.py` runs on every test run: once the bug is fixed
the input must give a result or a `TensorscopeError`, nothing else, ever again.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
REGRESSIONS = HERE.parent / "tests" / "fuzz_regressions"


def run_one(target: str, seed: str | None, path: str) -> int:
    """The exercise of one input, in this process: exit 0 when it ends as it should, else 3
    with the signature on stdout (a signal or a hang ends the process before)."""
    import fuzzlib
    data = Path(path).read_bytes()
    try:
        if target in fuzzlib.IN_MEMORY:
            fuzzlib.exercise_bytes(target, data)
        else:
            import tempfile
            ws = fuzzlib.Workspace(tempfile.mkdtemp(prefix="tensorscope-minimise-"))
            seed_path = Path(seed) if seed else fuzzlib.seeds(target)[0]
            fuzzlib.exercise(ws.path_for(seed_path, data), against=seed_path)
    except Exception as e:  # noqa: BLE001 - the outcome being classified
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if "tensorscope" in f.filename or "/parsers/" in f.filename]
        last = frames[-1] if frames else None
        where = f"{Path(last.filename).name}:{last.name}" if last else ""
        print(json.dumps(["exception", type(e).__name__, where]))
        return 3
    return 0


def signature(target: str, seed: str | None, data: bytes, timeout: float, scratch: Path):
    """How the exercise of ``data`` ends, run in a fresh process: None when it ends well."""
    scratch.write_bytes(data)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run", target, seed or "",
           str(scratch)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ("timeout",)
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:
        return ("signal", signal.Signals(-proc.returncode).name)
    if proc.returncode == 3 and proc.stdout.strip():
        return tuple(json.loads(proc.stdout.strip().splitlines()[-1]))
    # an abort that exited (a sanitizer's exitcode, a SystemExit): classified by its code
    return ("exit", proc.returncode)


def minimise(data: bytes, same, deadline: float) -> bytes:
    """Delta debugging: cut chunks (halves, then quarters ...) while ``same(candidate)``."""
    n = 2
    while len(data) >= 2 and time.monotonic() < deadline:
        chunk = max(1, len(data) // n)
        cut = False
        for start in range(0, len(data), chunk):
            if time.monotonic() >= deadline:
                break
            candidate = data[:start] + data[start + chunk:]
            if same(candidate):
                data, cut = candidate, True
                n = max(n - 1, 2)
                break
        if not cut:
            if chunk == 1:
                break
            n = min(len(data), n * 2)
    # then bytes made 0 where that keeps the failure (fewer distinct bytes to read in a test)
    for i in range(len(data)):
        if time.monotonic() >= deadline:
            break
        if data[i] and same(data[:i] + b"\0" + data[i + 1:]):
            data = data[:i] + b"\0" + data[i + 1:]
    return data


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--run":
        _, target, seed, path = argv
        return run_one(target, seed or None, path)
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("finding")
    ap.add_argument("--target", help="the fuzz target (default: from the finding's .json)")
    ap.add_argument("--seed", help="the fixture it was mutated from (diffed against)")
    ap.add_argument("--seconds", type=float, default=300, help="time to spend shrinking")
    ap.add_argument("--timeout", type=float, default=20, help="per run; longer is a hang")
    ap.add_argument("--out", default=str(REGRESSIONS))
    ap.add_argument("--name", help="file name stem (default <target>-<crc>)")
    args = ap.parse_args(argv)
    finding = Path(args.finding)
    meta = {}
    if finding.with_suffix(".json").exists():
        meta = json.loads(finding.with_suffix(".json").read_text())
    target = args.target or meta.get("target")
    seed = args.seed or meta.get("seed")
    if not target:
        ap.error("no target: pass --target (the finding has no .json)")
    import fuzzlib
    data = finding.read_bytes()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / f".minimise-{os.getpid()}.bin"
    try:
        want = signature(target, seed, data, args.timeout, scratch)
        if want is None:
            print(f"{finding}: does not fail (any more) as target {target}: nothing to keep")
            return 1
        print(f"{finding}: {len(data)} bytes, fails as {want}")
        tries = [0]

        def same(candidate: bytes) -> bool:
            tries[0] += 1
            return signature(target, seed, candidate, args.timeout, scratch) == want
        small = minimise(data, same, time.monotonic() + args.seconds)
    finally:
        scratch.unlink(missing_ok=True)
    stem = args.name or f"{target}-{fuzzlib.crc(small)}"
    (out / f"{stem}.bin").write_bytes(small)
    rel_seed = None
    if seed:
        try:
            rel_seed = str(Path(seed).resolve().relative_to(fuzzlib.ROOT))
        except ValueError:
            rel_seed = seed
    (out / f"{stem}.json").write_text(json.dumps(
        {"target": target, "seed": rel_seed, "signature": list(want),
         "from": finding.name, "bytes_before": len(data)}, indent=1) + "\n")
    print(f"{len(data)} -> {len(small)} bytes in {tries[0]} runs: {out / stem}.bin "
          f"(tests/test_fuzz_regressions.py runs it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
