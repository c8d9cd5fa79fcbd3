"""Where a sharded checkpoint's time goes in the TUI: each shard's parse, the merge after the last
shard, the name index and the grouped tree (issue 29).

    python benchmarks/tui_breakdown.py benchmarks/.cache/tui/moe_1000000_20shards

One process, the cyclic collector paused as the app pauses it; `open_model_by_shard` with a
listener that clocks each shard as it arrives (what the TUI's first screen waits for is the first).
"""
import sys, time, gc
t0 = time.perf_counter()
import tensorscope
from tensorscope.formats import gc_paused, open_model_by_shard
from tensorscope.tui.model_index import TensorIndex, index_chunk, build_group_tree
t_imp = time.perf_counter() - t0
path = sys.argv[1]
marks = []
t = time.perf_counter()
def on(name, shard, k, total):
    marks.append(time.perf_counter() - t)
with gc_paused():
    m = open_model_by_shard(path, on)
t_open = time.perf_counter() - t
shard_times = [b - a for a, b in zip([0] + marks, marks)]
t = time.perf_counter(); ix = TensorIndex(m.tensors); t_ix = time.perf_counter() - t
t = time.perf_counter(); ch = index_chunk(m.tensors[:50_000]); t_ch = time.perf_counter() - t
t = time.perf_counter(); tree = build_group_tree(m.tensors); t_tree = time.perf_counter() - t
t = time.perf_counter(); rows = ix.select(None, "experts.1"); t_f = time.perf_counter() - t
print(f"import {t_imp:.2f} s; open {t_open:.2f} s: first shard {shard_times[0]:.2f} s, shards median "
      f"{sorted(shard_times)[len(shard_times)//2]:.3f} s, sum {sum(shard_times):.2f} s, merge after the last {t_open - marks[-1]:.2f} s; "
      f"TensorIndex(1M) {t_ix:.2f} s, index_chunk(50k) {t_ch:.3f} s; grouped tree {t_tree:.2f} s; select 'experts.1' {t_f*1000:.0f} ms")
