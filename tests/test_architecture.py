"""The architecture summary of `inspect` on models transformers builds from small configs and
saves itself (safetensors, and sharded .bin): every figure equal to the config and to
model.num_parameters()."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

transformers = pytest.importorskip("transformers")

import tensorscope
from tensorscope.architecture import summarize

COMMON = dict(vocab_size=96, hidden_size=64, num_hidden_layers=3, num_attention_heads=4)
CONFIGS = {
    "llama": lambda T: T.LlamaConfig(intermediate_size=160, num_key_value_heads=2, **COMMON),
    "mistral": lambda T: T.MistralConfig(intermediate_size=128, num_key_value_heads=1, **COMMON),
    "mixtral": lambda T: T.MixtralConfig(intermediate_size=96, num_key_value_heads=2,
                                         num_local_experts=4, num_experts_per_tok=2, **COMMON),
    "qwen2_moe": lambda T: T.Qwen2MoeConfig(intermediate_size=96, moe_intermediate_size=32,
                                            shared_expert_intermediate_size=48,
                                            num_key_value_heads=2, num_experts=6,
                                            num_experts_per_tok=2, **COMMON),
    "gpt2": lambda T: T.GPT2Config(vocab_size=96, n_embd=64, n_layer=3, n_head=4,
                                   bos_token_id=0, eos_token_id=0),
    "bert": lambda T: T.BertConfig(intermediate_size=128, **COMMON),
}


def _model(T, name, cfg):
    return T.BertModel(cfg) if name == "bert" else T.AutoModelForCausalLM.from_config(cfg)


@pytest.fixture(scope="session")
def saved(tmp_path_factory):
    import torch
    T = transformers
    root = tmp_path_factory.mktemp("arch")
    out = {}
    for name, make in CONFIGS.items():
        torch.manual_seed(0)
        cfg = make(T)
        model = _model(T, name, cfg)
        folder = root / name
        model.save_pretrained(str(folder))
        out[name] = (cfg, model, folder)
    cfg = CONFIGS["llama"](T)
    model = _model(T, "llama", cfg)
    folder = root / "llama_bin"
    model.save_pretrained(str(folder), safe_serialization=False, max_shard_size="40KB")
    out["llama_bin"] = (cfg, model, folder)
    return out


def _summary(folder):
    with tensorscope.open(str(folder)) as m:
        return summarize(m)


def _active(model, cfg):
    routed = sum(p.numel() for n, p in model.named_parameters()
                 if ".experts." in n and "shared_expert" not in n)
    experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    return model.num_parameters() - routed + routed * cfg.num_experts_per_tok // experts


@pytest.mark.parametrize("name", list(CONFIGS) + ["llama_bin"])
def test_figures_equal_config_and_model(saved, name):
    cfg, model, folder = saved[name]
    s = _summary(folder)
    assert s["family"] == cfg.model_type
    assert s["params"] == model.num_parameters()
    assert s["layers"] == cfg.num_hidden_layers
    assert s["hidden_size"] == cfg.hidden_size
    assert s["vocab_size"] == cfg.vocab_size
    assert s["attention_heads"] == cfg.num_attention_heads
    assert s["kv_heads"] == getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    assert s["head_dim"] == (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    if name in ("mixtral", "qwen2_moe"):
        assert s["experts"] == (getattr(cfg, "num_local_experts", None) or cfg.num_experts)
        assert s["experts_per_token"] == cfg.num_experts_per_tok
        assert s["active_params_per_token"] == _active(model, cfg)
        assert s["intermediate_size"] == getattr(cfg, "moe_intermediate_size", cfg.intermediate_size)
    else:
        assert s["experts"] is None and "active_params_per_token" not in s
        assert s["intermediate_size"] == (cfg.n_inner or 4 * cfg.n_embd if name == "gpt2"
                                          else cfg.intermediate_size)
    assert sum(s["params_by_component"].values()) == s["params"]
    assert s["disagreements"] == []


def test_components(saved):
    cfg, model, folder = saved["llama"]
    s = _summary(folder)["params_by_component"]
    by = lambda key: sum(p.numel() for n, p in model.named_parameters() if key in n)
    assert s["attention"] == by("self_attn")
    assert s["mlp"] == by(".mlp.")
    assert s["embeddings"] == by("embed_tokens")
    assert s["head"] == by("lm_head")
    assert s["norms"] == by("norm")


def test_tied_embeddings(saved):
    assert _summary(saved["gpt2"][2])["tied_embeddings"] is True
    assert _summary(saved["llama"][2])["tied_embeddings"] is False
    assert _summary(saved["bert"][2])["tied_embeddings"] is None   # no output head at all


def test_disagreement_reported(saved, tmp_path):
    import shutil
    cfg, model, folder = saved["llama"]
    copy = tmp_path / "lying"
    shutil.copytree(folder, copy)
    conf = json.loads((copy / "config.json").read_text())
    conf["num_hidden_layers"] = 7
    conf["num_key_value_heads"] = 4
    (copy / "config.json").write_text(json.dumps(conf))
    s = _summary(copy)
    assert s["layers"] == cfg.num_hidden_layers      # the tensors win, the config is quoted
    assert any(d.startswith("layers: config 7") for d in s["disagreements"])
    assert any(d.startswith("kv_heads: config 4") for d in s["disagreements"])


def test_without_config_inferred_from_names(saved, tmp_path):
    import shutil
    cfg, model, folder = saved["mixtral"]
    shutil.copy(folder / "model.safetensors", tmp_path / "model.safetensors")
    s = _summary(tmp_path / "model.safetensors")
    assert s["config"] is None and s["family"]
    assert (s["layers"], s["hidden_size"], s["experts"]) == (3, 64, 4)
    assert s["params"] == model.num_parameters()


def test_inspect_cli(saved):
    folder = saved["mixtral"][2]
    r = subprocess.run([sys.executable, "-m", "tensorscope", "inspect", str(folder), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["model"]["experts"] == 4
    r = subprocess.run([sys.executable, "-m", "tensorscope", "inspect", str(folder)],
                       capture_output=True, text=True)
    assert "experts 4" in r.stdout and "active per token" in r.stdout


def _gguf(path, *, experts: int | None):
    """A llama-shaped GGUF written by gguf-py's own writer (names and keys as llama.cpp's
    converter writes them; values zero: only shapes matter)."""
    import numpy as np
    gguf = pytest.importorskip("gguf")
    L, H, I, V, heads, kv = 2, 64, 96, 80, 4, 2
    hd = H // heads
    w = gguf.GGUFWriter(str(path), "qwen2moe" if experts else "llama")
    w.add_block_count(L)
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(2)
    tensors = {"token_embd.weight": (V, H), "output_norm.weight": (H,), "output.weight": (V, H)}
    for i in range(L):
        b = f"blk.{i}."
        tensors.update({b + "attn_norm.weight": (H,), b + "attn_q.weight": (heads * hd, H),
                        b + "attn_k.weight": (kv * hd, H), b + "attn_v.weight": (kv * hd, H),
                        b + "attn_output.weight": (H, heads * hd), b + "ffn_norm.weight": (H,)})
        if experts:
            tensors.update({b + "ffn_gate_inp.weight": (experts, H),
                            b + "ffn_up_exps.weight": (experts, I, H),
                            b + "ffn_gate_exps.weight": (experts, I, H),
                            b + "ffn_down_exps.weight": (experts, H, I)})
        else:
            tensors.update({b + "ffn_up.weight": (I, H), b + "ffn_gate.weight": (I, H),
                            b + "ffn_down.weight": (H, I)})
    for name, shape in tensors.items():
        w.add_tensor(name, np.zeros(shape, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors, dict(L=L, H=H, I=I, V=V, heads=heads, kv=kv, hd=hd)


@pytest.mark.parametrize("experts", [None, 4])
def test_gguf_metadata_is_the_config(tmp_path, experts):
    import math
    tensors, c = _gguf(tmp_path / "m.gguf", experts=experts)
    s = _summary(tmp_path / "m.gguf")
    assert s["config"] == "gguf metadata" and s["disagreements"] == []
    assert (s["layers"], s["hidden_size"], s["vocab_size"], s["attention_heads"], s["kv_heads"],
            s["head_dim"], s["intermediate_size"]) == (c["L"], c["H"], c["V"], c["heads"],
                                                        c["kv"], c["hd"], c["I"])
    total = sum(math.prod(v) for v in tensors.values())
    assert s["params"] == total and s["tied_embeddings"] is False
    if experts:
        routed = sum(math.prod(v) for k, v in tensors.items() if "_exps" in k)
        assert s["experts"] == experts and s["experts_per_token"] == 2
        assert s["active_params_per_token"] == total - routed + routed * 2 // experts
        assert s["params_by_component"]["router"] == c["L"] * experts * c["H"]
    else:
        assert s["experts"] is None


def test_tied_weights_in_a_torch_state_dict(tmp_path):
    """torch.save(model.state_dict()) keeps both names of a tied weight over one storage."""
    import shutil
    import torch
    T = transformers
    cfg = CONFIGS["gpt2"](T)
    model = _model(T, "gpt2", cfg)
    folder = tmp_path / "gpt2_pt"
    folder.mkdir()
    sd = model.state_dict()
    assert "lm_head.weight" in sd
    torch.save(sd, str(folder / "pytorch_model.bin"))
    cfg.save_pretrained(str(folder))
    s = _summary(folder / "pytorch_model.bin")
    assert s["params"] == model.num_parameters()
    assert s["tied_embeddings"] is True
