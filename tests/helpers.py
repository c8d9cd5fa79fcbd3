"""Test helpers shared by the parser suites (no torch here; `torch_oracle.py` has the torch ones).

- `audit(...)`: the one audit hook of the test suite, armed around a block (exec, compile, process
  and network events, imports of modules not loaded before, opens outside a folder).
- `audited_open(path)`: `tensorscope.open` under `audit()` (after one unarmed open that warms our
  own lazy imports).
- `settle(pilot)`: wait until a Textual app has parsed, scanned and finished its workers.
- `run_cli(capsys, *argv)`: ``tensorscope ARGS...`` in this process -> (exit code, stdout, stderr)
  (the ``cli`` fixture of conftest.py wraps it).
- `PEAK_KB`: source text of ``peak_kb()`` (this process image's peak RSS, in KiB) for the
  subprocess probes that measure memory.
- `assert_mutants_fail_cleanly(open_source, paths, seed)`: random byte flips, cuts and insertions
  near a fixture's header give a FormatError or a clean listing whose reads stay in the buffer,
  never an IndexError/struct.error/UnicodeDecodeError.
- `gguf_with_template(path, template)`: a GGUF written by gguf-py whose chat template is
  ``template`` (a string, or the list of ``{"name", "template"}`` named variants).
"""
from __future__ import annotations

import os
import random
import sys

import tensorscope
from tensorscope.errors import FormatError
from tensorscope.source import ByteSource

def run_cli(capsys, *argv) -> tuple[int, str, str]:
    from tensorscope.cli import main
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# VmHWM, not ru_maxrss: Linux carries the parent's peak across exec into ru_maxrss.
PEAK_KB = """
def peak_kb():
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith("VmHWM:")).split()[1])
"""


# -- the one audit hook ---------------------------------------------------------------------------
# Events that mean code ran or the outside world was touched; any of them while armed is a failure.
FORBIDDEN_EVENTS = frozenset({"exec", "compile", "os.system", "os.fork", "os.forkpty",
                              "builtins.input", "pickle.find_class", "urllib.Request"})
FORBIDDEN_PREFIXES = ("os.exec", "os.spawn", "os.posix_spawn", "subprocess.", "socket.", "ctypes.",
                      "pty.", "webbrowser.")
_active: list = []   # the armed `audit`, if any (hooks cannot be removed: it only records while armed)


class audit:
    """Arm the audit hook around a block; on a clean exit, assert nothing forbidden happened.

    Recorded: the events above, the import of any module not loaded before (warm our own lazy
    imports first, unarmed), and, with ``allowed_dir``, any open() outside that folder
    (``forbid_open``: any open() at all). ``allow_ast_compile``: ast.parse builds a syntax tree,
    never a code object, so its `compile` event is not execution.

    >>> with audit() as a:            # doctest: +SKIP
    ...     tensorscope.scan(path)
    """

    def __init__(self, *, allowed_dir: str | None = None, forbid_open: bool = False,
                 allow_ast_compile: bool = False):
        self.allowed_dir = allowed_dir
        self.forbid_open = forbid_open
        self.allow_ast_compile = allow_ast_compile
        self.events: list[tuple[str, str]] = []

    def __enter__(self) -> "audit":
        self.events = []
        _active.append(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        _active.remove(self)
        if exc_type is None:
            assert self.events == [], f"forbidden audit events: {self.events[:5]}"

    def see(self, event: str, args) -> None:
        if event == "compile" and self.allow_ast_compile and \
                sys._getframe(2).f_code is _ast_parse_code():
            return
        if event in FORBIDDEN_EVENTS or event.startswith(FORBIDDEN_PREFIXES):
            self.events.append((event, repr(args)[:200]))
        elif event == "import" and args[0] not in sys.modules:
            self.events.append((event, str(args[0])[:80]))
        elif event == "open" and (self.forbid_open or self.allowed_dir is not None) and \
                isinstance(args[0], (str, bytes, os.PathLike)):
            real = os.path.realpath(os.fsdecode(args[0]))
            if self.forbid_open or not real.startswith(self.allowed_dir):
                self.events.append((event, real))


def _ast_parse_code():
    import ast
    return ast.parse.__code__


def _hook(event, args):
    if _active:
        _active[-1].see(event, args)


sys.addaudithook(_hook)


def audited_open(path):
    """`tensorscope.open` under the audit hook (after one unarmed open that warms our imports)."""
    tensorscope.open(path).close()
    with audit():
        return tensorscope.open(path)


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


def gguf_with_template(path, template):
    """A one-tensor GGUF written by gguf-py's own writer, carrying ``template`` as
    ``tokenizer.chat_template`` (named variants when a list). Returns ``path``."""
    import gguf
    import numpy as np
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_chat_template(template)
    w.add_tensor("w", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
