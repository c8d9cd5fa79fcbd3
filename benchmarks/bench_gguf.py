"""Benchmark: listing a GGUF file, tensorscope against gguf-py's GGUFReader (what gguf-dump runs).

Writes ``benchmarks/.cache/gguf/qwen7b_q4k.gguf`` once, with gguf-py's own GGUFWriter: the layout
of a Qwen2.5-7B Q4_K_M conversion (28 blocks, 339 tensors at their real shapes, Q4_K/Q6_K weights,
F32 norms and biases) and its real-size metadata: a 151,936-token vocabulary with scores and
types, 151,387 merges, a chat template. The tensor data (4.4 GB) is left as a hole (a sparse
file: listing reads no tensor bytes, so the disk holds only the ~8 MB of metadata).

Each command runs as a whole process, median of R runs after a warm-up (`common.measure`):

- tensorscope: ``tensorscope inspect --json FILE`` (every tensor and the metadata);
- gguf-py: ``GGUFReader(FILE)`` then name, type and shape of every tensor (``gguf-dump`` reads the
  file the same way).

Run: ``python benchmarks/bench_gguf.py [--runs 3]``.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import CACHE, measure  # noqa: E402

PATH = CACHE / "gguf" / "qwen7b_q4k.gguf"
PEER = ("import sys, gguf\nr = gguf.GGUFReader(sys.argv[1])\n"
        "for t in r.tensors: print(t.name, t.tensor_type.name, list(t.shape))\n")


def generate(path: Path = PATH) -> None:
    """The Qwen2.5-7B-shaped GGUF, metadata real, tensor data a hole."""
    import numpy as np
    import gguf
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    q4k, q6k, f32 = (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K,
                     gguf.GGMLQuantizationType.F32)
    hidden, ffn, vocab, kv = 3584, 18944, 152064, 512

    def nbytes(shape, qtype):
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        return int(np.prod(shape)) // block * size

    w = gguf.GGUFWriter(str(tmp), "qwen2")
    w.add_name("Qwen2.5 7B Instruct (benchmark layout)")
    w.add_block_count(28)
    w.add_context_length(32768)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(28)
    w.add_head_count_kv(4)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    tokens = [f"\u0120tok{i}" for i in range(151_936)]
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges([f"\u0120t ok{i}" for i in range(151_387)])
    w.add_chat_template("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' "
                        "+ message.content + '<|im_end|>\\n' }}{%- endfor %}")
    infos = [("token_embd.weight", (vocab, hidden), q4k)]
    for b in range(28):
        for name, shape, qtype in (
                ("attn_q", (hidden, hidden), q4k), ("attn_k", (kv, hidden), q4k),
                ("attn_v", (kv, hidden), q6k), ("attn_output", (hidden, hidden), q4k),
                ("ffn_gate", (ffn, hidden), q4k), ("ffn_up", (ffn, hidden), q4k),
                ("ffn_down", (hidden, ffn), q6k)):
            infos.append((f"blk.{b}.{name}.weight", shape, qtype))
        for name, n in (("attn_q", hidden), ("attn_k", kv), ("attn_v", kv)):
            infos.append((f"blk.{b}.{name}.bias", (n,), f32))
        infos += [(f"blk.{b}.attn_norm.weight", (hidden,), f32),
                  (f"blk.{b}.ffn_norm.weight", (hidden,), f32)]
    infos += [("output_norm.weight", (hidden,), f32), ("output.weight", (vocab, hidden), q6k)]
    for name, shape, qtype in infos:
        if qtype == f32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes(shape, qtype))
        else:   # quantized: GGUFWriter takes the shape in bytes per row
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            w.add_tensor_info(name, (*shape[:-1], shape[-1] // block * size), np.dtype(np.uint8),
                              nbytes(shape, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    # the data section: every tensor at its aligned offset, as a hole
    end = os.path.getsize(tmp)
    align = 32
    data = -(-end // align) * align
    total = sum(-(-nbytes(s, q) // align) * align for _, s, q in infos)
    with open(tmp, "r+b") as f:
        f.truncate(data + total)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    import subprocess
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(HERE)!r}); "
                    "import bench_gguf; bench_gguf.generate()"], check=True)
    ours = measure([sys.executable, "-m", "tensorscope", "inspect", "--json", str(PATH)],
                   args.runs)
    peer = measure([sys.executable, "-c", PEER, str(PATH)], args.runs)
    for label, r in (("tensorscope inspect --json", ours), ("gguf-py GGUFReader + list", peer)):
        if r.error:
            print(f"{label}: {r.error}")
            return 1
    mib = 1 << 20
    print(f"GGUF {PATH.name}: {os.path.getsize(PATH) / 1e9:.2f} GB (sparse), 339 tensors, "
          f"151,936-token vocabulary; median of {args.runs}")
    print("| command | wall | CPU | peak RSS |")
    print("|---|---:|---:|---:|")
    for label, r in (("tensorscope inspect --json", ours), ("gguf-py GGUFReader + list", peer)):
        print(f"| {label} | {r.wall:.2f} s | {r.cpu:.2f} s | {r.rss / mib:.0f} MiB |")
    print(f"ratio: {peer.wall / ours.wall:.1f}x faster, {peer.rss / ours.rss:.1f}x less memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
