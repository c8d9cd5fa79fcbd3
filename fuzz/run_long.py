#!/usr/bin/env python3
"""Long-run mutation fuzzer for every tensorscope parser; needs no atheris.

Each worker process loops: pick a target parser, a fixture seed, apply one to three structural
mutations (`fuzzlib.mutate`), write the input to its own folder under /dev/shm, and run the
exercise (`fuzzlib.exercise`: open, read every tensor, scan; or the in-memory pickle VM / zip
reader). The parent watches every worker:

- a hard per-input timeout: a worker stuck longer than ``--timeout`` seconds is killed and its
  current input saved as a ``hang``; inputs slower than ``--slow`` are saved as ``slow``;
- memory: after each input a worker compares its ``ru_maxrss`` with its baseline; growth above
  ``--rss-mb`` saves the input as ``rss`` and restarts the worker (maxrss never goes down);
  an address-space limit turns a runaway allocation into a MemoryError, saved as a ``crash``;
- any exception other than TensorscopeError (or any exception from scan) is a ``crash``;
  an exec/compile/import/process/socket audit event, or an open outside the input's folder,
  is an ``exec``.

Findings go to ``--out`` as ``<kind>-<target>-<key>.bin`` with a ``.txt`` traceback, one per
distinct (kind, target, exception, place). Counts are printed every ``--report`` seconds and at
the end, per target: inputs, outcomes (ok / ok+ = some tensor refused / error = refused).

Usage:
    python fuzz/run_long.py --seconds 3600 --workers 2
    python fuzz/run_long.py --targets pickle_vm,zipfmt --max-inputs 100000
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzzlib  # noqa: E402

_FORBIDDEN = {"exec", "compile", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
              "subprocess.Popen", "socket.connect", "socket.bind", "pty.spawn", "ctypes.dlopen",
              "os.fork", "os.forkpty", "webbrowser.open"}


import ast  # noqa: E402

_AST_PARSE = ast.parse.__code__


class _Audit:
    """Audit hook state for one worker (hooks cannot be removed, so they are armed/disarmed)."""

    armed = False
    allowed = ""
    events: list = []

    @classmethod
    def hook(cls, event, args):
        if not cls.armed:
            return
        if event == "compile" and sys._getframe(1).f_code is _AST_PARSE:
            return  # ast.parse: source to a syntax tree only, no code object (scanner, TorchScript)
        if event in _FORBIDDEN:
            cls.events.append((event, repr(args)[:200]))
        elif event == "import" and args[0] not in sys.modules:
            cls.events.append((event, args[0]))
        elif event == "open" and isinstance(args[0], (str, bytes)):
            real = os.path.realpath(os.fsdecode(args[0]))
            if not real.startswith(cls.allowed) and not real.startswith("/dev/urandom"):
                cls.events.append((event, real))


def _save(out: Path, kind: str, target: str, key: str, data: bytes, text: str,
          seed: str | None = None) -> bool:
    """One finding: the input (``.bin``), what happened (``.txt``) and, for the minimiser
    (`fuzz/minimise.py`), its target, kind and seed (``.json``)."""
    digest = hashlib.sha1(f"{kind}|{target}|{key}".encode()).hexdigest()[:10]
    stem = out / f"{kind}-{target}-{digest}"
    try:
        if stem.with_suffix(".bin").exists():
            return False
        stem.with_suffix(".bin").write_bytes(data)
        stem.with_suffix(".txt").write_text(text)
        stem.with_suffix(".json").write_text(json.dumps(
            {"kind": kind, "target": target, "key": key, "seed": seed}))
    except OSError as e:  # a full disk must not stop the run
        print(f"cannot save {stem}: {e}", file=sys.stderr, flush=True)
        return False
    return True


def _workspace(pid: int) -> Path:
    return Path(f"/dev/shm/tensorscope-fuzz-{pid}")


def _current_input(root) -> Path:
    return Path(root) / "current-input.bin"


def _last_input(pid: int) -> tuple[bytes, str | None]:
    """The input a worker was running when it died or was killed, and its seed."""
    cur = _current_input(_workspace(pid))
    try:
        seed = cur.with_suffix(".seed").read_text()
    except OSError:
        seed = None
    try:
        return cur.read_bytes(), seed
    except OSError:
        return b"", seed


def _worker(idx: int, targets: list[str], seed: int, out: str, started, current, queue,
            slow: float, rss_mb: int, as_mb: int, stop_at: float, budget) -> None:
    os.nice(10)
    resource.setrlimit(resource.RLIMIT_AS, (as_mb << 20, as_mb << 20))
    out_dir = Path(out)
    ws = fuzzlib.Workspace(_workspace(os.getpid()))
    rng = random.Random(seed)
    corpus = {t: fuzzlib.seed_bytes(t) for t in targets}
    others = {t: [b for _, b in corpus[t]] for t in targets}
    # Warm: lazy imports of our own modules happen once, unarmed.
    fuzzlib.warm()
    for t in targets:
        if t in fuzzlib.SELFTESTS:
            continue
        p, b = corpus[t][0]
        try:
            if t in fuzzlib.IN_MEMORY:
                fuzzlib.exercise_bytes(t, b)
            else:
                fuzzlib.exercise(ws.path_for(p, b))
        except Exception:
            pass
    sys.addaudithook(_Audit.hook)
    # the input's folder, the fixtures (the seed an input is diffed against), and our own
    # sources (a RuntimeWarning's line is read by linecache to print it)
    _Audit.allowed = (os.path.realpath(ws.root), os.path.realpath(fuzzlib.FIXTURES),
                      os.path.realpath(fuzzlib.ROOT / "tensorscope") + os.sep,
                      os.path.realpath(fuzzlib.ROOT / "parsers") + os.sep)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    stats = collections.defaultdict(collections.Counter)
    worst: dict[str, float] = collections.defaultdict(float)
    last_flush = time.time()

    def flush():
        queue.put((idx, {t: dict(c) for t, c in stats.items()}, dict(worst),
                   (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024))
        stats.clear()
        worst.clear()

    try:
        while time.time() < stop_at:
            with budget.get_lock():
                if budget.value <= 0:
                    break
                budget.value -= 1
            target = rng.choice(targets)
            seed_path, data = rng.choice(corpus[target])
            names = []
            for _ in range(rng.choice((1, 1, 1, 2, 3))):
                name, data = fuzzlib.mutate(rng, data, others[target])
                names.append(name)
            path = ws.path_for(seed_path, data)
            # the input, where the parent finds it if this process dies (a signal, the kernel's
            # OOM killer) or is killed (a hang): written before the exercise, every time
            _current_input(ws.root).write_bytes(data)
            _current_input(ws.root).with_suffix(".seed").write_text(str(seed_path))
            current[idx] = targets.index(target)
            _Audit.events = []
            _Audit.armed = True
            t0 = time.monotonic()
            started[idx] = t0
            kind = None
            try:
                if target in fuzzlib.IN_MEMORY:
                    outcome = fuzzlib.exercise_bytes(target, data)
                else:
                    outcome = fuzzlib.exercise(path, against=seed_path)
            except BaseException as e:  # noqa: BLE001 - every other exception is the finding
                if isinstance(e, KeyboardInterrupt):
                    raise
                _Audit.armed = False
                outcome = "crash"
                tb = traceback.extract_tb(e.__traceback__)
                last = tb[-1] if tb else None
                key = f"{type(e).__name__}@{last.filename.rsplit('/', 1)[-1]}:{last.lineno}" if last else type(e).__name__
                kind = "crash"
                text = (f"target {target}, seed {seed_path}, mutators {names}\n"
                        + "".join(traceback.format_exception(e))[-6000:])
                _save(out_dir, kind, target, key, data, text, str(seed_path))
            finally:
                started[idx] = 0.0
                _Audit.armed = False
            dt = time.monotonic() - t0
            st = stats[target]
            st["inputs"] += 1
            st[outcome] += 1
            worst[target] = max(worst[target], dt)
            if _Audit.events:
                st["exec"] += 1
                _save(out_dir, "exec", target, repr(_Audit.events[0][:1]), data,
                      f"target {target}, seed {seed_path}, mutators {names}\n{_Audit.events[:10]}")
            if dt > slow:
                st["slow"] += 1
                _save(out_dir, "slow", target, f"{seed_path.name}-{'+'.join(names)}-{fuzzlib.crc(data)}",
                      data, f"target {target}, seed {seed_path}, mutators {names}, {dt:.2f} s\n")
            grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024
            if grown > rss_mb:
                st["rss"] += 1
                _save(out_dir, "rss", target, f"{seed_path.name}-{'+'.join(names)}-{fuzzlib.crc(data)}",
                      data, f"target {target}, seed {seed_path}, mutators {names}, maxrss grew "
                            f"{grown:.0f} MB\n")
                flush()
                return  # restarted by the parent with a fresh maxrss
            if time.time() - last_flush > 2:
                flush()
                last_flush = time.time()
    finally:
        flush()
        shutil.rmtree(ws.root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default=",".join(fuzzlib.ALL_TARGETS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--max-inputs", type=int, default=1_000_000)
    ap.add_argument("--timeout", type=float, default=10.0, help="hard per-input limit (kill)")
    ap.add_argument("--slow", type=float, default=2.0, help="save inputs slower than this")
    ap.add_argument("--rss-mb", type=int, default=200, help="maxrss growth that counts as a blow-up")
    ap.add_argument("--as-mb", type=int, default=3072, help="address-space limit per worker")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "findings"))
    ap.add_argument("--report", type=float, default=60.0, help="seconds between progress lines")
    ap.add_argument("--stats-json", default=None, help="write the final counts here")
    args = ap.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    for t in targets:
        if t not in fuzzlib.ALL_TARGETS and t not in fuzzlib.SELFTESTS:
            ap.error(f"unknown target {t!r}; known: {', '.join(fuzzlib.ALL_TARGETS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("fork")
    started = ctx.Array("d", args.workers, lock=False)
    current = ctx.Array("i", args.workers, lock=False)
    budget = ctx.Value("q", args.max_inputs)
    queue = ctx.Queue()
    stop_at = time.time() + args.seconds
    totals = collections.defaultdict(collections.Counter)
    worst = collections.defaultdict(float)
    peak_rss = 0.0
    procs: dict[int, mp.Process] = {}
    incarnation = collections.Counter()

    def spawn(i):
        incarnation[i] += 1
        seed = args.seed * 1_000_003 + i * 7919 + incarnation[i] * 104729
        p = ctx.Process(target=_worker, args=(i, targets, seed, str(out), started, current, queue,
                                              args.slow, args.rss_mb, args.as_mb, stop_at, budget),
                        daemon=True)
        started[i] = 0.0
        p.start()
        procs[i] = p

    def drain():
        nonlocal peak_rss
        while True:
            try:
                _i, st, w, grown = queue.get_nowait()
            except Exception:
                return
            for t, c in st.items():
                totals[t].update(c)
            for t, v in w.items():
                worst[t] = max(worst[t], v)
            peak_rss = max(peak_rss, grown)

    def line() -> str:
        n = sum(c["inputs"] for c in totals.values())
        parts = [f"{t}={totals[t]['inputs']}" for t in targets]
        bad = {k: sum(c[k] for c in totals.values())
               for k in ("crash", "signal", "hang", "slow", "rss", "exec")}
        return (f"[{time.strftime('%H:%M:%S')}] {n} inputs ({', '.join(parts)}); "
                + ", ".join(f"{k} {v}" for k, v in bad.items())
                + f"; worst {max(worst.values(), default=0):.2f} s, maxrss growth {peak_rss:.0f} MB")

    t_start = time.time()
    for i in range(args.workers):
        spawn(i)
    last_report = time.time()
    try:
        while procs:
            time.sleep(0.25)
            drain()
            now = time.monotonic()
            for i, p in list(procs.items()):
                t0 = started[i]
                if p.is_alive() and t0 and now - t0 > args.timeout:
                    os.kill(p.pid, signal.SIGKILL)
                    p.join()
                    target = targets[current[i]]
                    ws = _workspace(p.pid)
                    data, seed = _last_input(p.pid)
                    _save(out, "hang", target, fuzzlib.crc(data), data,
                          f"target {target}: worker killed after {args.timeout} s on this input\n",
                          seed)
                    totals[target]["hang"] += 1
                    totals[target]["inputs"] += 1
                    shutil.rmtree(ws, ignore_errors=True)
                    del procs[i]
                    if time.time() < stop_at and budget.value > 0:
                        spawn(i)
                elif not p.is_alive():
                    p.join()
                    del procs[i]
                    if p.exitcode not in (0, None):
                        # died by a signal (a segfault, an abort from a sanitizer, the OOM
                        # killer's SIGKILL) or exited: the input it was running is kept
                        target = targets[current[i]]
                        data, seed = _last_input(p.pid)
                        how = (signal.Signals(-p.exitcode).name if p.exitcode < 0
                               else f"exit {p.exitcode}")
                        _save(out, "signal" if p.exitcode < 0 else "died", target,
                              f"{how}-{fuzzlib.crc(data)}", data,
                              f"target {target}: worker died ({how}) on this input\n", seed)
                        totals[target]["signal" if p.exitcode < 0 else "crash"] += 1
                        print(f"worker {i} died ({how}) on a {target} input: saved", flush=True)
                    shutil.rmtree(_workspace(p.pid), ignore_errors=True)
                    if time.time() < stop_at and budget.value > 0:
                        spawn(i)  # an rss restart, or a death
            if time.time() - last_report > args.report:
                print(line(), flush=True)
                last_report = time.time()
    except KeyboardInterrupt:
        for p in procs.values():
            p.terminate()
    time.sleep(0.5)
    drain()
    elapsed = time.time() - t_start
    print(line(), flush=True)
    print(f"elapsed {elapsed:.0f} s; findings in {out}")
    for t in targets:
        c = totals[t]
        print(f"  {t:12s} inputs {c['inputs']:8d}  ok {c['ok']:7d}  ok+ {c['ok+']:6d}  "
              f"error {c['error']:7d}  crash {c['crash']}  signal {c['signal']}  "
              f"hang {c['hang']}  slow {c['slow']}  "
              f"rss {c['rss']}  exec {c['exec']}  worst {worst[t]:.2f} s")
    if args.stats_json:
        Path(args.stats_json).write_text(json.dumps(
            {"elapsed": elapsed, "peak_rss_growth_mb": peak_rss, "worst": worst,
             "totals": {t: dict(c) for t, c in totals.items()}}, indent=2, sort_keys=True))
    bad = sum(c[k] for c in totals.values() for k in ("crash", "signal", "hang", "rss", "exec"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
