"""`diff` answers how B is related to A: a verdict per tensor and for the pair, checked on pairs
made by the real operations (torch casts, a peft LoRA merged with merge_and_unload, torch's
pruning, torch.ao per-channel int8 and gguf-py's Q8_0/Q4_0 quantization, a re-initialised head,
an independently initialised twin, a renamed re-save) — and what must not be claimed."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from tensorscope.cli import main
from tensorscope.diffing import diff_models

HIDDEN, INTER, LAYERS, VOCAB = 384, 768, 2, 320
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _llama(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                      num_attention_heads=6, num_key_value_heads=6, vocab_size=VOCAB,
                      tie_word_embeddings=False, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def _sd(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def _save_st(sd, path):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return str(path)


def _lora(base, r: int, targets, seed: int):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(seed)
    cfg = LoraConfig(r=r, lora_alpha=r, target_modules=list(targets), init_lora_weights=False,
                     lora_dropout=0.0)
    merged = get_peft_model(copy.deepcopy(base), cfg).merge_and_unload()
    return _sd(merged)


def _pruned(base, amount: float):
    from torch.nn.utils import prune
    m = copy.deepcopy(base)
    for name, mod in m.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in ("q_proj", "up_proj"):
            prune.l1_unstructured(mod, "weight", amount=amount)
            prune.remove(mod, "weight")
    return _sd(m)


def _finetune(base, steps: int = 4):
    m = copy.deepcopy(base).train()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (4, 32), generator=g)
        loss = m(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return _sd(m.eval())


def _per_channel_int8(sd):
    from torch.ao.quantization import PerChannelMinMaxObserver
    out = {}
    for k, v in sd.items():
        if v.ndim == 2 and any(p in k for p in LINEARS):
            obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8,
                                           qscheme=torch.per_channel_symmetric)
            obs(v)
            scale, zp = obs.calculate_qparams()
            out[k] = torch.quantize_per_channel(v, scale.double(), zp.long(), 0, torch.qint8)
        else:
            out[k] = v
    return out


def _gguf(sd, path, qtype):
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in sd.items():
        x = v.float().numpy()
        if x.ndim == 2 and any(p in k for p in LINEARS):
            q = gguf.quants.quantize(x, qtype)
            w.add_tensor(k, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            w.add_tensor(k, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture(scope="session")
def pairs(tmp_path_factory):  # noqa: D401
    """Every pair, built once: name -> (A path, B path)."""
    import gguf
    d = tmp_path_factory.mktemp("verdict_pairs")
    base = _llama(0)
    sd = _sd(base)
    a = _save_st(sd, d / "base.safetensors")
    torch.save(sd, d / "base.pt")
    out = {"bf16": (a, _save_st({k: v.to(torch.bfloat16) for k, v in sd.items()}, d / "bf16.safetensors")),
           "half": (a, _save_st({k: v.half() for k, v in sd.items()}, d / "half.safetensors"))}
    out["lora4"] = (a, _save_st(_lora(base, 4, ("q_proj", "v_proj"), 1), d / "lora4.safetensors"))
    out["lora8"] = (a, _save_st(_lora(base, 8, ("q_proj", "v_proj"), 2), d / "lora8.safetensors"))
    out["lora64"] = (a, _save_st(_lora(base, 64, ("down_proj",), 3), d / "lora64.safetensors"))
    out["prune30"] = (a, _save_st(_pruned(base, 0.3), d / "prune30.safetensors"))
    out["prune90"] = (a, _save_st(_pruned(base, 0.9), d / "prune90.safetensors"))
    q = d / "int8.pt"
    torch.save(_per_channel_int8(sd), q)
    out["int8"] = (a, str(q))
    out["q8_0"] = (a, _gguf(sd, d / "q8_0.gguf", gguf.GGMLQuantizationType.Q8_0))
    out["q4_0"] = (a, _gguf(sd, d / "q4_0.gguf", gguf.GGMLQuantizationType.Q4_0))
    head = copy.deepcopy(base)
    torch.manual_seed(9)
    head.lm_head.reset_parameters()
    out["reinit_head"] = (a, _save_st(_sd(head), d / "head.safetensors"))
    out["unrelated"] = (a, _save_st(_sd(_llama(1)), d / "other.safetensors"))
    renamed = {k.replace("model.", "decoder.", 1).replace("self_attn", "attention"): v
               for k, v in sd.items()}
    out["renamed"] = (str(d / "base.pt"), _save_st(renamed, d / "renamed.safetensors"))
    out["finetune"] = (a, _save_st(_finetune(base), d / "finetune.safetensors"))
    return out


def _kinds(result) -> dict[str, str]:
    return {e.name: e.verdict.kind for e in result.entries}


def test_cast_bfloat16_and_half(pairs):
    for case, dt in (("bf16", "bfloat16"), ("half", "float16")):
        r = diff_models(*pairs[case])
        kinds = _kinds(r)
        assert set(kinds.values()) == {"cast"}, kinds
        for e in r.entries:
            assert e.verdict.evidence["rounding"] == "round-to-nearest-even"
            assert e.verdict.evidence["rne_mismatch"] == 0
        assert r.verdict.kind == "cast"
        assert r.verdict.text.startswith(f"B is A cast to {dt} (round-to-nearest-even)")
        assert r.exit_code == 1   # no tolerance given: rounding is a difference
