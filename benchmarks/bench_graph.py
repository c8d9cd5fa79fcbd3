"""Benchmark: `tensorscope graph` on a 10,000-node ONNX model and a 1,000-layer .pt2, against
the peers' own readers walking the same nodes.

Inputs (made once under ``benchmarks/.cache/graph/``, by child processes):

- ``nodes10k.onnx``: 1,000 blocks of 10 nodes (MatMul, Add, Relu, MatMul, Add, Mul, Reshape,
  Transpose, Reshape, Add) over [8, 64] activations and 64x64 float32 weights, written with
  ``onnx.helper``, without ``value_info``: shapes come from onnx shape inference, the slow path.
- ``layers1k.pt2``: ``torch.export.save`` of 1,000 ``Linear(32, 32)`` + ``relu`` layers.

Each case runs in its own process (page cache warm), median of R runs; inside, the phases are
timed with ``time.perf_counter``:

- tensorscope: ``tensorscope.open`` (parse), then ``build_graph`` (the graph: nodes, shapes,
  parameters, FLOPs; "beyond parsing" is this phase), then the JSON document;
- ONNX peer: ``onnx.load`` + a walk of every node (op, inputs, outputs, attribute values) +
  ``onnx.shape_inference.infer_shapes`` (what gives it shapes);
- .pt2 peer: ``torch.export.load`` + a walk of every node (op, target, args, meta["val"] shape).

Run: ``python benchmarks/bench_graph.py [--repeat 3] [--blocks 1000] [--layers 1000]``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CACHE = Path(__file__).resolve().parent / ".cache" / "graph"
PY = sys.executable

GEN_ONNX = r'''
import sys, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
path = sys.argv[1]; blocks = int(sys.argv[2]); d = 64
rng = np.random.default_rng(0)
nodes, inits = [], []
x = "x"
shape = numpy_helper.from_array(np.array([8, 4, 16], np.int64), "shape3")
back = numpy_helper.from_array(np.array([8, 64], np.int64), "shape2")
inits += [shape, back]
for i in range(blocks):
    p = f"/layers.{i}"
    w1, b1, w2, b2, s = (f"layers.{i}.fc1.weight", f"layers.{i}.fc1.bias",
                         f"layers.{i}.fc2.weight", f"layers.{i}.fc2.bias", f"layers.{i}.scale")
    for name, shp in ((w1, (d, d)), (b1, (d,)), (w2, (d, d)), (b2, (d,)), (s, (d,))):
        inits.append(numpy_helper.from_array(rng.standard_normal(shp).astype(np.float32), name))
    o = [f"{p}/o{k}" for k in range(10)]
    nodes += [helper.make_node("MatMul", [x, w1], [o[0]], name=f"{p}/fc1/MatMul"),
              helper.make_node("Add", [o[0], b1], [o[1]], name=f"{p}/fc1/Add"),
              helper.make_node("Relu", [o[1]], [o[2]], name=f"{p}/Relu"),
              helper.make_node("MatMul", [o[2], w2], [o[3]], name=f"{p}/fc2/MatMul"),
              helper.make_node("Add", [o[3], b2], [o[4]], name=f"{p}/fc2/Add"),
              helper.make_node("Mul", [o[4], s], [o[5]], name=f"{p}/Mul"),
              helper.make_node("Reshape", [o[5], "shape3"], [o[6]], name=f"{p}/Reshape"),
              helper.make_node("Transpose", [o[6]], [o[7]], name=f"{p}/Transpose", perm=[0, 1, 2]),
              helper.make_node("Reshape", [o[7], "shape2"], [o[8]], name=f"{p}/Reshape_1"),
              helper.make_node("Add", [o[8], x], [o[9]], name=f"{p}/Add")]
    x = o[9]
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, d])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [8, d])], inits)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
'''

GEN_PT2 = r'''
import sys, torch, torch.nn as nn
path = sys.argv[1]; n = int(sys.argv[2])
class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(n))
    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x
torch.export.save(torch.export.export(Deep(), (torch.randn(4, 32),)), path)
'''

OURS = r'''
import json, sys, time, io
t0 = time.perf_counter()
import tensorscope
from tensorscope.graph import build_graph
t1 = time.perf_counter()
m = tensorscope.open(sys.argv[1])
t2 = time.perf_counter()
parse = t2 - t1
if m.format == "onnx":   # the lazy import build_graph would pay for shape inference, timed apart
    import onnx.shape_inference
t_import = time.perf_counter() - t2
t2 = time.perf_counter()
g = build_graph(m)
nodes = sum(1 for _ in g.nodes())
t3 = time.perf_counter()
doc = json.dumps({**g.to_header(), "nodes": [n.to_dict() for n in g.nodes()]}, default=str)
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "parse": parse, "onnx_import": t_import,
                  "graph": t3 - t2, "json": t4 - t3,
                  "nodes": nodes, "shapes": sum(1 for n in g.nodes() for v in n.outputs if v.shape is not None),
                  "flops": g.totals()["flops"]}))
'''

ONNX_PEER = r'''
import json, sys, time
t0 = time.perf_counter()
import onnx
from onnx import helper, shape_inference
t1 = time.perf_counter()
model = onnx.load(sys.argv[1])
t2 = time.perf_counter()
n = 0
for node in model.graph.node:
    (node.name, node.op_type, list(node.input), list(node.output),
     {a.name: helper.get_attribute_value(a) for a in node.attribute})
    n += 1
t3 = time.perf_counter()
inferred = shape_inference.infer_shapes(model)
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "parse": t2 - t1, "graph": t3 - t2, "infer": t4 - t3,
                  "nodes": n, "shapes": len(inferred.graph.value_info)}))
'''

PT2_PEER = r'''
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
ep = torch.export.load(sys.argv[1])
t2 = time.perf_counter()
n = 0
for node in ep.graph.nodes:
    if node.op == "call_function":
        val = node.meta.get("val")
        (node.name, str(node.target), node.args, tuple(val.shape) if hasattr(val, "shape") else None)
        n += 1
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "parse": t2 - t1, "graph": t3 - t2, "nodes": n}))
'''


def _run(code: str, *args: str) -> dict:
    out = subprocess.run([PY, "-c", code, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(code: str, path: Path, repeat: int, warmup: bool = True) -> dict:
    if warmup:
        _run(code, str(path))   # page cache, bytecode
    runs = [_run(code, str(path)) for _ in range(repeat)]
    return {k: statistics.median(r[k] for r in runs) if isinstance(runs[0][k], float) else runs[0][k]
            for k in runs[0]}


def generate(blocks: int = 1000, layers: int = 1000) -> tuple[Path, Path]:
    CACHE.mkdir(parents=True, exist_ok=True)
    onnx_path, pt2_path = CACHE / f"nodes{blocks * 10}.onnx", CACHE / f"layers{layers}.pt2"
    if not onnx_path.exists():
        subprocess.run([PY, "-c", GEN_ONNX, str(onnx_path), str(blocks)], check=True)
    if not pt2_path.exists():
        subprocess.run([PY, "-c", GEN_PT2, str(pt2_path), str(layers)], check=True)
    return onnx_path, pt2_path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=1000, help="ONNX blocks of 10 nodes")
    ap.add_argument("--layers", type=int, default=1000, help=".pt2 Linear+relu layers")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="no unmeasured first run (the smoke test)")
    args = ap.parse_args(argv)
    onnx_path, pt2_path = generate(args.blocks, args.layers)
    r, w = args.repeat, args.warmup
    ours_o, peer_o = _median(OURS, onnx_path, r, w), _median(ONNX_PEER, onnx_path, r, w)
    ours_p, peer_p = _median(OURS, pt2_path, r, w), _median(PT2_PEER, pt2_path, r, w)
    assert ours_o["nodes"] == peer_o["nodes"] and ours_p["nodes"] == peer_p["nodes"]
    print(f"| file | reader | parse | graph (beyond parsing) | JSON | nodes |")
    print("|---|---|---:|---:|---:|---:|")
    print(f"| {onnx_path.name} ({onnx_path.stat().st_size / 1e6:.1f} MB) | tensorscope | "
          f"{ours_o['parse']:.3f} s | {ours_o['graph']:.3f} s (+ import onnx "
          f"{ours_o['onnx_import']:.3f} s) | {ours_o['json']:.3f} s | {ours_o['nodes']:,} |")
    print(f"| | onnx.load + node walk + infer_shapes | {peer_o['parse']:.3f} s | "
          f"{peer_o['graph'] + peer_o['infer']:.3f} s (walk {peer_o['graph']:.3f} + infer "
          f"{peer_o['infer']:.3f}) | - | {peer_o['nodes']:,} |")
    print(f"| {pt2_path.name} ({pt2_path.stat().st_size / 1e6:.1f} MB) | tensorscope | "
          f"{ours_p['parse']:.3f} s | {ours_p['graph']:.3f} s | {ours_p['json']:.3f} s | {ours_p['nodes']:,} |")
    print(f"| | torch.export.load + node walk | {peer_p['parse']:.3f} s | {peer_p['graph']:.3f} s | - | "
          f"{peer_p['nodes']:,} |")
    o_ours = ours_o["parse"] + ours_o["graph"] + ours_o["onnx_import"]
    o_peer = peer_o["parse"] + peer_o["graph"] + peer_o["infer"] + peer_o["import"]
    p_ours, p_peer = ours_p["parse"] + ours_p["graph"], peer_p["parse"] + peer_p["graph"]
    print(f"\nONNX, parse + graph with shapes, onnx's import included on both sides: tensorscope "
          f"{o_ours:.3f} s, onnx {o_peer:.3f} s "
          f"({o_peer / o_ours:.2f}x); .pt2, parse + graph: tensorscope {p_ours:.3f} s, torch "
          f"{p_peer:.3f} s ({p_peer / p_ours:.2f}x). Imports: tensorscope {ours_o['import']:.2f} s, "
          f"onnx {peer_o['import']:.2f} s, torch {peer_p['import']:.2f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
