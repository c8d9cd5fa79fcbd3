"""Test helpers shared by the parser suites (no torch here; `torch_oracle.py` has the torch ones).

- `audited_open(path)`: `tensorscope.open` under an audit hook that fails on exec, compile or
  the import of a module not loaded before (after one unarmed open that warms our own lazy imports).
- `settle(pilot)`: wait until a Textual app has parsed, scanned and finished its workers.
- `assert_mutants_fail_cleanly(open_source, paths, seed)`: random byte flips, cuts and insertions
  near a fixture's header give a FormatError or a clean listing whose reads stay in the buffer,
  never an IndexError/struct.error/UnicodeDecodeError.
"""
from __future__ import annotations

import random
import sys

import tensorscope
from tensorscope.errors import FormatError
from tensorscope.source import ByteSource

_armed = {"on": False, "events": []}


def _audit(event, args):
    if _armed["on"] and (event in ("exec", "compile") or
                         (event == "import" and args[0] not in sys.modules)):
        _armed["events"].append((event, str(args[0])[:80]))


sys.addaudithook(_audit)  # cannot be removed: it only records while armed


def audited_open(path):
    tensorscope.open(path).close()  # warm our own lazy imports, unarmed
    _armed.update(on=True, events=[])
    try:
        return tensorscope.open(path)
    finally:
        _armed["on"] = False
        assert _armed["events"] == [], _armed["events"]


def assert_mutants_fail_cleanly(open_source, paths, seed: int, per_file: int = 60) -> None:
    rng = random.Random(seed)
    for path in paths:
        data = path.read_bytes()
        for _ in range(per_file):
            b = bytearray(data)
            pos = rng.randrange(min(len(b), 300))
            op = rng.random()
            if op < 0.6:
                b[pos] = rng.randrange(256)
            elif op < 0.8:
                del b[pos:pos + rng.randint(1, 16)]
            else:
                b[pos:pos] = rng.randbytes(rng.randint(1, 8))
            src = ByteSource.from_bytes(bytes(b), "mutated")
            try:
                model = open_source(src)
            except FormatError:
                continue
            model.sources["mutated"] = src
            for t in model.tensors:
                try:
                    model.read(t)
                except FormatError:
                    pass



# -- TUI ------------------------------------------------------------------------------------------
def _busy(app) -> bool:
    """Something is still on its way: parsing, the scan, a worker, a pane saying "computing"."""
    from textual.worker import WorkerState

    screen = app.screen
    if type(screen).__name__ == "LoadingScreen" or not app.scan_done or not screen.is_mounted:
        return True
    if any(w.state in (WorkerState.PENDING, WorkerState.RUNNING) for w in app.workers):
        return True
    if type(screen).__name__ == "DiffScreen" and screen.result is None and screen.error is None:
        return True
    for static in screen.query("#d-stats, #dd-hist"):
        if "computing" in str(static.content):
            return True
    return False


async def settle(pilot) -> None:
    """Wait until parsing, the scan (it starts after the first paint) and every worker are done."""
    import asyncio

    app = pilot.app
    for _ in range(2000):
        await pilot.pause()
        await app.workers.wait_for_complete()
        if not _busy(app):
            break
        await asyncio.sleep(0.01)
    await pilot.pause()
