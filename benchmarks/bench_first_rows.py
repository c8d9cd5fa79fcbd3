"""First rows on a terminal: `tensorscope inspect` started on a pseudo-terminal, timed from the
spawn to the first table rows on screen and to the end of its output.

    python benchmarks/bench_first_rows.py                       # the 100k inputs of bench_scale
    python benchmarks/bench_first_rows.py --runs 5 PATH [PATH ...]

The inputs are bench_scale's (``benchmarks/.cache/scale/``: run ``python benchmarks/bench_scale.py
--sizes 100000 --keep`` first). Each run is a child on its own pseudo-terminal (`pty.fork`, 160
columns, like a person's window); a row is a line after the header that holds a shape
(``[4, 4]``). The stderr notice an open prints when it is slow (``reading <file> …``) is not a row.
Reported: the median over ``--runs`` of the time to the first ``--rows`` rows, and to the end.
"""
from __future__ import annotations

import argparse
import os
import pty
import re
import select
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROW = re.compile(rb"\[[0-9, ]*\]")


def first_rows(argv: list[str], rows: int, timeout: float = 120.0) -> tuple[float | None, float]:
    """(seconds to the first ``rows`` rows, seconds to the end of output) of one run."""
    pid, fd = pty.fork()
    if pid == 0:    # the child: a terminal of 160 x 50
        os.environ.update(COLUMNS="160", LINES="50")
        os.execvp(argv[0], argv)
    start = time.perf_counter()
    buf, first = b"", None
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                break
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:     # the child closed the terminal
                break
            if not chunk:
                break
            buf += chunk
            if first is None:
                lines = buf.split(b"\n")[1:-1]      # after the header, complete lines only
                if sum(1 for line in lines if ROW.search(line)) >= rows:
                    first = time.perf_counter() - start
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    return first, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="inputs (default: bench_scale's 100k torch zip and "
                                             "shards)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--no-group", action="store_true", help="also time --no-group")
    args = ap.parse_args(argv)
    scale = HERE / ".cache" / "scale"
    paths = args.paths or [str(scale / "st_100000"), str(scale / "torch_100000.pt")]
    variants = [[]] + ([["--no-group"]] if args.no_group else [])
    print(f"| input | options | first {args.rows} rows (median of {args.runs}) | whole output |")
    print("|---|---|---:|---:|")
    for path in paths:
        if not os.path.exists(path):
            print(f"missing {path}: run benchmarks/bench_scale.py --sizes 100000 --keep first",
                  file=sys.stderr)
            return 2
        for extra in variants:
            runs = [first_rows([sys.executable, "-m", "tensorscope", "inspect", path, *extra],
                               args.rows) for _ in range(args.runs)]
            firsts = [f for f, _ in runs if f is not None]
            first = f"{statistics.median(firsts):.2f} s" if len(firsts) == len(runs) else "no rows"
            print(f"| {os.path.basename(path)} | {' '.join(extra) or '(default)'} | {first} | "
                  f"{statistics.median(t for _, t in runs):.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
