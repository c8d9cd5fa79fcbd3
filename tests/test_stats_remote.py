"""The remote range planner: bytes and requests of listing each layout over the tests' HTTP
server, and the planner's cost rule (`remote.merge_gap`, `remote.plan_requests`) with its knobs.

Layouts: a 2 GB torch zip of 500 large tensors (a real ``torch.save`` under ``skip_data``: the
storage bytes are holes, served as zeros), a torch zip of 20,000 small tensors, and an ONNX
model with its initializers embedded. Each listing must match the local listing, fetch at most
1% of a large file, and wait on the network a bounded number of times (round trips in a row).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tensorscope
from tensorscope import remote
from tensorscope.errors import TensorscopeError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_server import Server  # noqa: E402

torch = pytest.importorskip("torch")


def _listing(url: str):
    remote.reset_totals()
    with tensorscope.open(url, listing=True) as m:
        names = [(t.name, t.dtype, t.shape, t.byte_offset) for t in m.tensors]
        src = next(iter(m.sources.values()))
        waits = src.waits
    return names, remote.totals(), waits


def _local(path):
    with tensorscope.open(str(path), listing=True) as m:
        return [(t.name, t.dtype, t.shape, t.byte_offset) for t in m.tensors]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.serialization import skip_data
    root = tmp_path_factory.mktemp("remote")
    with FakeTensorMode():
        big = {f"layer.{i}.weight": torch.empty(1024, 2048, dtype=torch.float16) for i in range(500)}
    with skip_data(materialize_fake_tensors=True):
        torch.save(big, root / "large.pt")
    g = torch.Generator().manual_seed(0)
    torch.save({f"model.layers.{i // 768}.mlp.experts.{(i // 3) % 256}.w{i % 3}": torch.randn(4, 4, generator=g)
                for i in range(20_000)}, root / "small.pt")
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper
    inits = [numpy_helper.from_array(np.full((256, 512), i, dtype=np.float32), f"w{i}") for i in range(60)]
    node = helper.make_node("Identity", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])], inits)
    onnx.save(helper.make_model(graph), str(root / "embedded.onnx"))
    yield root
    for p in root.iterdir():
        p.unlink()


@pytest.mark.parametrize("name,max_fraction,max_waits", [
    ("large.pt", 0.01, 3),      # 500 local headers 4 MiB apart: one request each, in one wave
    ("small.pt", 1.0, 5),       # 20,000 headers ~100 bytes apart: a few large requests
    ("embedded.onnx", 0.05, 40),  # the protobuf walk hops over each embedded raw_data field
])
def test_listing_each_layout_costs_what_the_planner_says(layouts, name, max_fraction, max_waits):
    path = layouts / name
    with Server(layouts) as s:
        got, cost, waits = _listing(s.url(name))
        assert s.knobs.requests == cost["requests"] and s.knobs.bytes_sent == cost["bytes"]
    assert got == _local(path)
    size = path.stat().st_size
    print(f"{name}: {size} bytes, fetched {cost['bytes']} ({cost['bytes'] / size:.3%}) in "
          f"{cost['requests']} requests, {waits} waits")
    assert cost["bytes"] <= max_fraction * size
    assert waits <= max_waits
    if name == "large.pt":
        assert size > 2 * 10**9
        assert cost["requests"] <= len(got) + 5      # a request per header, none per tensor data
    if name == "small.pt":
        assert cost["requests"] <= size // remote.MAX_REQUEST + 5


def test_round_trip_and_bandwidth_knobs(layouts, monkeypatch):
    """A fast network far away (a request worth 62.5 MB) fills the 4 MiB holes of the large zip:
    few requests, most bytes; the defaults (~23 KB) leave them."""
    monkeypatch.setenv("TENSORSCOPE_ROUND_TRIP", "1s")
    monkeypatch.setenv("TENSORSCOPE_BANDWIDTH", "1G")
    assert remote.merge_gap() == 1_000_000_000 // remote.WORKERS
    monkeypatch.setenv("TENSORSCOPE_FETCH_BUDGET", "4G")
    with Server(layouts) as s:
        _, cost, _ = _listing(s.url("large.pt"))
    size = (layouts / "large.pt").stat().st_size
    assert cost["bytes"] > 0.9 * size and cost["requests"] <= size // remote.MAX_REQUEST + 5
    monkeypatch.delenv("TENSORSCOPE_ROUND_TRIP")
    monkeypatch.delenv("TENSORSCOPE_BANDWIDTH")
    assert remote.merge_gap() == remote.MAX_GAP == int(remote.ROUND_TRIP * remote.BANDWIDTH / remote.WORKERS)


@pytest.mark.parametrize("name,value", [("TENSORSCOPE_ROUND_TRIP", "fast"), ("TENSORSCOPE_ROUND_TRIP", "0"),
                                        ("TENSORSCOPE_BANDWIDTH", "12 parsecs")])
def test_bad_knob_is_a_clear_error(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(TensorscopeError, match=name):
        remote.merge_gap()


def test_plan_requests_fills_only_cheap_holes():
    assert remote.plan_requests([], 100) == []
    # holes of 50 (filled), 100 (not: equal to the gap is not cheaper), overlap (joined)
    assert remote.plan_requests([(0, 10), (60, 70), (170, 180), (175, 200)], 100) == \
        [(0, 70), (170, 200)]
    # big runs are cut so that they go out concurrently
    assert remote.plan_requests([(0, 25)], 0, max_request=10) == [(0, 10), (10, 20), (20, 25)]
    # order of the input does not matter; empty runs are dropped
    assert remote.plan_requests([(90, 95), (5, 5), (0, 10)], 1000) == [(0, 95)]
