"""What model a checkpoint holds: family, sizes, heads, experts and parameters per component.

Read from two witnesses that a user can check against each other: the folder's ``config.json``
(``architectures``, ``model_type`` and the size fields transformers reads) and the tensors
themselves (names and shapes). Each figure says where it came from; where both give one and they
differ, the disagreement is reported (``disagreements``): a config that does not describe its
weights is evidence too. The config is read as JSON, nothing else.

From the tensors (Hugging Face naming, which most checkpoints follow):
- layers: the distinct indices of the indexed block (``layers.#``, ``h.#``, ``layer.#``,
  ``blocks.#``); hidden size and vocabulary: the token embedding ``[vocab, hidden]``;
- heads: ``q_proj`` rows / head dim, key/value heads ``k_proj`` rows / head dim (head dim from
  the config, else hidden / heads); intermediate: the MLP's up/gate/fc1 rows;
- experts: the distinct ``experts.#`` indices; active per token from the config
  (``num_experts_per_tok``); tied embeddings: no output head tensor (or the config says so).
- parameters by component: embeddings, attention, MLP (dense MLPs, experts, shared experts),
  router, norms, head, other; active per token for MoE = all but the routed experts, plus the
  routed experts' share ``active / total``.

Public: `summarize(model) -> dict | None`.
"""
from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict

from .grouping import GroupCollector

__all__ = ["summarize", "describe"]

CONFIG_MAX = 4 << 20

_BLOCK = re.compile(r"(?:^|\.)(layers|h|layer|blocks|block|blk)\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")
_GGUF_EXPERTS = re.compile(r"\.ffn_(up|gate|down)_exps\.")     # llama.cpp: [experts, rows, cols]
_EMBED = re.compile(r"(embed_tokens|wte|wpe|word_embeddings|tok_embeddings|token_embd|"
                    r"embed_positions|embeddings?\.weight$)")
_HEAD = re.compile(r"(^|\.)(lm_head|output|cls|score|classifier|head|pooler)\.")
_NORM = re.compile(r"(norm|ln_|ln\d|layernorm|LayerNorm|ln_f)", re.I)
_ATTN = re.compile(r"(attn|attention|self_attn|q_proj|k_proj|v_proj|o_proj)")
_ROUTER = re.compile(r"(\.router\.|block_sparse_moe\.gate\.|mlp\.gate\.weight|shared_expert_gate|"
                     r"ffn_gate_inp)")
_MLP = re.compile(r"(mlp|feed_forward|ffn|intermediate|experts|shared_expert|\.output\.dense)")


# llama.cpp's GGUF keys (``<arch>.<key>``) -> the config.json names this module reads
_GGUF_KEYS = {"block_count": "num_hidden_layers", "embedding_length": "hidden_size",
              "feed_forward_length": "intermediate_size",
              "expert_feed_forward_length": "moe_intermediate_size",
              "attention.head_count": "num_attention_heads",
              "attention.head_count_kv": "num_key_value_heads",
              "attention.key_length": "head_dim", "expert_count": "num_experts",
              "expert_used_count": "num_experts_per_tok", "vocab_size": "vocab_size"}


def _gguf_config(model) -> dict | None:
    """A GGUF file's own metadata, as the config it stands for (``general.architecture``)."""
    kv = (model.metadata.get("gguf") or {}).get("kv") if isinstance(model.metadata, dict) else None
    if not isinstance(kv, dict) or not isinstance(kv.get("general.architecture"), str):
        return None
    arch = kv["general.architecture"]
    cfg: dict = {"model_type": arch}
    for key, name in _GGUF_KEYS.items():
        v = kv.get(f"{arch}.{key}")
        if isinstance(v, int) and not isinstance(v, bool):
            cfg[name] = v
    return cfg


def _config(model) -> tuple[dict | None, str | None]:
    if model.format == "gguf":
        cfg = _gguf_config(model)
        return cfg, ("gguf metadata" if cfg else None)
    files = [f for f in (model.files or [model.path]) if isinstance(f, str) and "://" not in f]
    if not files:
        return None, None
    folder = model.path if os.path.isdir(model.path) else os.path.dirname(os.path.abspath(files[0]))
    path = os.path.join(folder, "config.json")
    try:
        if os.path.getsize(path) > CONFIG_MAX:
            return None, path
        with open(path, "rb") as f:
            cfg = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return None, None
    if isinstance(cfg, dict) and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}   # multimodal wrappers: the language model's sizes
    return (cfg if isinstance(cfg, dict) else None), path


def _component(name: str) -> str:
    if _EMBED.search(name) and not _BLOCK.search(name):
        return "embeddings"
    if _HEAD.search(name) and not _BLOCK.search(name):
        return "head"
    if _NORM.search(name):
        return "norms"
    if _ROUTER.search(name):
        return "router"
    if _ATTN.search(name) and ".output.dense" not in name.replace("attention.output.dense", ""):
        return "attention"
    if _MLP.search(name):
        return "experts" if _EXPERT.search(name) or _GGUF_EXPERTS.search(name) else "mlp"
    return "other"


def _int(cfg: dict | None, *keys):
    for k in keys:
        v = (cfg or {}).get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _unique(tensors):
    """The model's own tensors, each storage view once: a tied weight saved under two names
    (``lm_head.weight`` over ``wte.weight``'s storage, as ``torch.save(model.state_dict())``
    writes it) is one parameter, as ``model.num_parameters()`` counts it, and its second name
    leaves the output head to the embedding (tied)."""
    seen: set[tuple] = set()
    for t in tensors:
        if t.role in ("input", "constant"):
            continue
        if t.storage_key is not None:
            view = (t.file, t.storage_key, t.storage_offset, t.shape, t.stride, t.dtype)
            if view in seen:
                continue
            seen.add(view)
        yield t


class _Group:
    """One group of `GroupCollector`: its first member's name, the shape, the count, and the
    distinct index values per ``#`` of its pattern."""

    __slots__ = ("name", "shape", "count", "pattern", "ranges")

    def __init__(self, g: dict):
        self.name, self.shape, self.count = g["first"], tuple(g["shape"]), g["count"]
        self.pattern, self.ranges = g["pattern"], g["ranges"]

    def distinct(self, marker: str) -> int | None:
        """How many values the ``#`` of ``marker`` (``layers.#``) takes in this group."""
        at = ("." + self.pattern + ".").find("." + marker + ".")
        if at < 0:
            return None
        k = self.pattern[:at + len(marker)].count("#") - 1
        return self.ranges[k][2] if 0 <= k < len(self.ranges) else None


def _first(tensors, pattern: str):
    rx = re.compile(pattern)
    for t in tensors:
        if rx.search(t.name) and len(t.shape) == 2:
            return t
    return None


def summarize(model, collector: GroupCollector | None = None) -> dict | None:
    """The architecture summary of an opened model, or None when nothing is recognisable.
    ``collector``: a `GroupCollector` already fed with every one of ``model.tensors`` (as
    ``inspect`` groups them), reused when each tensor is its own (no tied views, no inputs)."""
    cfg, cfg_path = _config(model)
    # Read as groups (`tensorscope.grouping`: ``layers.#.mlp.experts.#.up_proj.weight`` ×N, one
    # record per pattern, dtype and shape): a million tensors are a few thousand groups, and
    # each rule below runs once per group, not per tensor.
    own = list(_unique(model.tensors))
    if collector is None or len(own) != len(model.tensors):
        # the grouping pass is the costly one per tensor: run it only when no caller did
        collector = GroupCollector()
        collector.add_tensors(own)
    tensors = [_Group(g) for g in collector.groups()]
    if not tensors:
        return None
    layers: dict[str, int] = {}
    experts: set[int] = set()
    by_component: dict[str, int] = defaultdict(int)
    expert_params = 0
    total = 0
    for g in tensors:
        n = math.prod(g.shape) * g.count
        total += n
        m = _BLOCK.search(g.name)
        if m:
            k = g.distinct(f"{m.group(1)}.#")
            if k:
                layers[m.group(1)] = max(layers.get(m.group(1), 0), k)
        if _EXPERT.search(g.name):
            k = g.distinct("experts.#")
            if k and k > len(experts):
                experts = set(range(k))
        comp = _component(g.name)
        by_component[comp] += n
        if comp == "experts" and "shared_expert" not in g.name:
            expert_params += n
    out: dict = {"config": cfg_path if cfg else None}
    disagree: list[str] = []

    def put(key, from_cfg, from_tensors):
        if from_cfg is not None and from_tensors is not None and from_cfg != from_tensors:
            disagree.append(f"{key}: config {from_cfg}, tensors {from_tensors}")
        value = from_tensors if from_tensors is not None else from_cfg
        out[key] = value
        out.setdefault("sources", {})[key] = "tensors" if from_tensors is not None else \
            ("config" if from_cfg is not None else None)
        return value

    archs = (cfg or {}).get("architectures")
    family = (cfg or {}).get("model_type")
    out["architectures"] = archs if isinstance(archs, list) else None
    out["family"] = family if isinstance(family, str) else _infer_family(tensors, experts)
    put("layers", _int(cfg, "num_hidden_layers", "n_layer", "num_layers"),
        max(layers.values()) if layers else None)
    emb = _first(tensors, r"(embed_tokens|wte|word_embeddings|tok_embeddings|token_embd)\.weight$")
    put("hidden_size", _int(cfg, "hidden_size", "n_embd", "d_model"), emb.shape[1] if emb else None)
    put("vocab_size", _int(cfg, "vocab_size"), emb.shape[0] if emb else None)
    hidden = out["hidden_size"]
    heads_cfg = _int(cfg, "num_attention_heads", "n_head")
    head_dim = _int(cfg, "head_dim") or (hidden // heads_cfg if hidden and heads_cfg else None)
    q = _first(tensors, r"(q_proj|self\.query|wq|attn_q)\.weight$")
    k = _first(tensors, r"(k_proj|self\.key|wk|attn_k)\.weight$")
    put("attention_heads", heads_cfg, q.shape[0] // head_dim if q and head_dim else None)
    kv_cfg = _int(cfg, "num_key_value_heads") or heads_cfg
    put("kv_heads", kv_cfg, k.shape[0] // head_dim if k and head_dim else None)
    out["head_dim"] = head_dim
    up = _first(tensors, r"(mlp\.(up_proj|gate_proj|c_fc|fc1)|intermediate\.dense|feed_forward\.w1|"
                         r"\.ffn_up)\.weight$")
    inter = None
    if up is not None:
        inter = up.shape[1] if up.name.endswith("c_fc.weight") else up.shape[0]   # GPT-2 Conv1D
    elif experts:
        first = _first(tensors, r"experts\.\d+\.(up_proj|gate_proj|w1|w3)\.weight$")
        inter = first.shape[0] if first is not None else None
    gguf_exps = next((t for t in tensors if _GGUF_EXPERTS.search(t.name) and len(t.shape) == 3
                      and ".ffn_up_exps." in t.name), None)
    if gguf_exps is not None:   # [experts, intermediate, hidden]
        experts = set(range(gguf_exps.shape[0]))
        inter = gguf_exps.shape[1]
    put("intermediate_size", _int(cfg, "moe_intermediate_size", "intermediate_size", "n_inner",
                                  "ffn_dim") if experts else _int(cfg, "intermediate_size", "n_inner"),
        inter)
    lm_head = _first(tensors, r"(^|\.)(lm_head|output|embed_out)\.weight$")
    has_head = lm_head is not None
    tied_cfg = (cfg or {}).get("tie_word_embeddings")
    # no output head in the file: tied to the embedding, when the architecture has one (a bare
    # encoder, BertModel, has no output head to tie)
    bare = isinstance(archs, list) and archs and all(str(a).endswith("Model") and "LMHead" not in str(a)
                                                    for a in archs)
    out["tied_embeddings"] = None if bare or emb is None else (not has_head)
    if isinstance(tied_cfg, bool) and emb is not None and tied_cfg and has_head:
        disagree.append("tie_word_embeddings: config true, but the file holds its own output head")
    n_experts = put("experts", _int(cfg, "num_local_experts", "num_experts", "n_routed_experts"),
                    len(experts) if experts else None)
    active = _int(cfg, "num_experts_per_tok", "top_k", "moe_top_k") if n_experts else None
    out["experts_per_token"] = active
    out["params"] = total
    out["params_by_component"] = {k: v for k, v in by_component.items() if v}
    if n_experts and active:
        out["active_params_per_token"] = total - expert_params + expert_params * active // n_experts
    out["disagreements"] = disagree
    return out


def _infer_family(tensors, experts) -> str | None:
    names = " ".join(t.name for t in tensors[:200])
    if "block_sparse_moe" in names:
        return "mixtral-like"
    if "q_proj" in names and experts:
        return "moe (llama-like)"
    if "q_proj" in names:
        return "llama-like"
    if "c_attn" in names:
        return "gpt2-like"
    if "attention.self.query" in names:
        return "bert-like"
    return None


def describe(summary: dict | None) -> list[str]:
    """The summary as a few lines of plain, escaped text (for the table and the TUI)."""
    from .safetext import shown
    if not summary or not (summary.get("layers") or summary.get("hidden_size")):
        return []
    fields = [("family", summary.get("family")), ("layers", summary.get("layers")),
              ("hidden", summary.get("hidden_size")),
              ("intermediate", summary.get("intermediate_size")),
              ("heads", summary.get("attention_heads")), ("kv heads", summary.get("kv_heads")),
              ("head dim", summary.get("head_dim")), ("vocab", summary.get("vocab_size")),
              ("tied embeddings", summary.get("tied_embeddings"))]
    if summary.get("experts"):
        fields += [("experts", summary["experts"]),
                   ("experts per token", summary.get("experts_per_token"))]
    lines = ["model " + "   ".join(f"{k} {shown(v)}" for k, v in fields if v is not None)]
    parts = ", ".join(f"{k} {v:,}" for k, v in summary.get("params_by_component", {}).items())
    line = f"model params {summary['params']:,} ({parts})"
    if summary.get("active_params_per_token") is not None:
        line += f"   active per token {summary['active_params_per_token']:,}"
    lines.append(line)
    for d in summary.get("disagreements") or ():
        lines.append(f"config/tensors disagree: {shown(d)}")
    return lines
