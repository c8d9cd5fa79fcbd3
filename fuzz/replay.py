#!/usr/bin/env python3
"""Replay a corpus through an in-memory harness once per input, without atheris.

The sanitizer job (`.ci/sanitize.sh`) fuzzes with atheris in the optimised build, where
libFuzzer's coverage hooks work, and replays what it kept here under the ASan+UBSan build: with
libasan preloaded into an interpreter not linked with libFuzzer, the sanitizer runtime provides the
coverage symbols, so atheris sees no coverage (its corpus collapses to one byte) and every traced
comparison gets slower as the run goes on (a 29 KB pickle took 109 s). Replaying keeps the
sanitizer on every input the coverage-guided run found, and its time bounded by the inputs.

Usage: python fuzz/replay.py TARGET PATH... (folders are read file by file)
Prints a count per outcome; a Python exception other than TensorscopeError (a bug, or an
assertion that the C differs from its twin) is printed with its input and the exit code is 1.
"""
from __future__ import annotations

import sys
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzzlib  # noqa: E402


def inputs(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        found.extend(sorted(q for q in p.iterdir() if q.is_file()) if p.is_dir() else [p])
    return found


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in fuzzlib.IN_MEMORY:
        print(f"usage: replay.py {{{','.join(fuzzlib.IN_MEMORY)}}} PATH...", file=sys.stderr)
        return 2
    target, files = argv[0], inputs(argv[1:])
    fuzzlib.import_all()
    outcomes: Counter[str] = Counter()
    failed = 0
    slowest = (0.0, "")
    for f in files:
        start = time.perf_counter()
        try:
            outcomes[fuzzlib.exercise_bytes(target, f.read_bytes())] += 1
        except Exception:  # noqa: BLE001 (any exception escaping the harness is the finding)
            failed += 1
            print(f"replay {target}: {f} failed:", file=sys.stderr)
            traceback.print_exc()
        slowest = max(slowest, (time.perf_counter() - start, f.name))
    counts = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
    print(f"replay {target}: {len(files)} inputs ({counts}; {failed} failed), "
          f"slowest {slowest[0]:.2f} s ({slowest[1]})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
