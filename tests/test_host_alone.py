"""A library leaves its host alone (issue 24, DESIGN.md): `tensorscope.open()` and `close()`
change no process-wide state of the garbage collector, whatever the application set up, and
listing mode is an argument of `open()`, not a state of the process."""
from __future__ import annotations

import gc
import threading

import pytest
import torch

import tensorscope
from torch_oracle import FIXTURES

FILES = [FIXTURES / "torch" / p for p in ("nested.pth",)] + \
    sorted((FIXTURES / "formats").glob("*.safetensors"))[:1] + \
    sorted((FIXTURES / "onnx").glob("*.onnx"))[:1]


def _gc_state():
    return (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count())


def _same_as(want) -> bool:
    """The collector as the application left it: enabled or not, its thresholds, and its frozen
    generation neither grown (a freeze of our records) nor emptied (an unfreeze of its own);
    frozen objects that die meanwhile leave it, so it may shrink by those."""
    now = _gc_state()
    return now[:2] == want[:2] and 0.9 * want[2] <= now[2] <= want[2]


@pytest.fixture
def application_gc():
    """An application that froze its own objects, tuned its thresholds and turned the collector
    off (and another that keeps it on): put back as it was after the test."""
    before = (gc.isenabled(), gc.get_threshold())
    junk = [[object()] for _ in range(1000)]
    gc.freeze()
    yield junk
    gc.unfreeze()
    gc.set_threshold(*before[1])
    (gc.enable if before[0] else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("listing", [False, True])
def test_open_and_close_leave_the_collector_as_the_application_set_it(application_gc, enabled,
                                                                     listing, tmp_path):
    gc.set_threshold(1234, 56, 78)
    (gc.enable if enabled else gc.disable)()
    big = tmp_path / "many.pt"
    torch.save({f"layers.{i}.w": torch.ones(2) for i in range(2000)}, big)
    want = _gc_state()
    assert want[2] > 0   # the application's own frozen objects
    for path in [*FILES, big]:
        model = tensorscope.open(path, listing=listing)
        assert _same_as(want), f"open({path.name}) changed the collector: {_gc_state()}, {want}"
        list(model.tensors)
        model.close()
        assert _same_as(want), f"close({path.name}) changed the collector: {_gc_state()}, {want}"


def test_the_application_garbage_is_still_collected_after_open(application_gc):
    """Open froze nothing: a cycle the application drops after an open is collected."""
    with tensorscope.open(FIXTURES / "torch" / "nested.pth"):
        pass

    class Node:
        pass
    a, b = Node(), Node()
    a.other, b.other = b, a
    ref = __import__("weakref").ref(a)
    del a, b
    gc.collect()
    assert ref() is None


def test_open_in_threads_leaves_the_collector_alone():
    want = _gc_state()
    errors = []

    def worker():
        try:
            for _ in range(3):
                with tensorscope.open(FIXTURES / "torch" / "nested.pth", listing=True):
                    pass
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and _same_as(want)


def test_the_cli_pauses_its_own_collector_and_restores_it(tmp_path, capsys):
    """The tuning lives in the CLI process (`cli.GC_PAUSED`): on during the command it is off,
    and as it was afterwards."""
    from tensorscope import cli, formats
    seen = []
    real = formats.gc_paused

    def spy():
        seen.append(gc.isenabled())
        return real()
    want = _gc_state()
    old = formats.gc_paused
    formats.gc_paused = spy
    try:
        assert cli.main(["inspect", str(FIXTURES / "torch" / "nested.pth"), "--json"]) == 0
    finally:
        formats.gc_paused = old
    assert seen == [want[0]] and _same_as(want)


def test_a_fleet_scan_leaves_the_hosts_own_freeze_alone(tmp_path):
    """scan_fleet forks workers with the parent's objects frozen, but never thaws what the host
    froze itself, and leaves no freeze of its own behind."""
    import gc
    import pickle
    import subprocess
    import sys
    import textwrap
    for i in range(3):
        (tmp_path / f"m{i}.pkl").write_bytes(pickle.dumps({"w": list(range(4))}))
    code = textwrap.dedent(f"""
        import gc
        from tensorscope.scanning.fleet import scan_fleet
        keep = [[i] for i in range(1000)]
        gc.freeze()
        frozen = gc.get_freeze_count()
        scan_fleet([{str(tmp_path)!r}], jobs=2)
        # still frozen (a few frozen temporaries may have died meanwhile; an unfreeze drops to 0)
        assert gc.get_freeze_count() > frozen - 100, (gc.get_freeze_count(), frozen)
        gc.unfreeze()
        scan_fleet([{str(tmp_path)!r}], jobs=2)
        assert gc.get_freeze_count() == 0, gc.get_freeze_count()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    assert gc.isenabled()
