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
def pairs(tmp_path_factory):
    """Every pair, built once: name -> (A path, B path)."""
    import warnings
    with warnings.catch_warnings():
        # transformers' and torch's deprecation notices about their own APIs, not ours
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return _build_pairs(tmp_path_factory)


def _build_pairs(tmp_path_factory):
    import gguf
    d = tmp_path_factory.mktemp("verdict_pairs")
    base = _llama(0)
    sd = _sd(base)
    a = _save_st(sd, d / "base.safetensors")
    torch.save(sd, d / "base.pt")
    bf16 = {k: v.to(torch.bfloat16) for k, v in sd.items()}
    out = {"bf16": (a, _save_st(bf16, d / "bf16.safetensors")),
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


def _of(result, kind: str) -> list:
    return [e for e in result.entries if e.verdict.kind == kind]


def _is_linear(name: str, mods=LINEARS) -> bool:
    return any(f".{m}." in name for m in mods)


@pytest.mark.parametrize("case,dt", [("bf16", "bfloat16"), ("half", "float16")])
def test_cast_says_which_rounding(pairs, case, dt):
    r = diff_models(*pairs[case])
    kinds = {e.name: e.verdict.kind for e in r.entries}
    # the norms' weights are 1.0, exact in any float dtype: the same values, not a rounding
    assert {k for n, k in kinds.items() if n.endswith("norm.weight")} == {"same_values"}
    casts = _of(r, "cast")
    assert len(casts) == len(r.entries) - sum(n.endswith("norm.weight") for n in kinds)
    for e in casts:
        assert e.verdict.evidence["rounding"] == "round-to-nearest-even"
        assert e.verdict.evidence["rne_mismatch"] == 0 and e.verdict.evidence["dtype"] == dt
    assert r.verdict.kind == "cast"
    assert r.verdict.text.startswith(f"B is A cast to {dt} (round-to-nearest-even)")
    assert r.exit_code == 1   # no tolerance given: rounding is a difference


def test_truncation_is_told_from_rounding(tmp_path):
    """float32 -> bfloat16 by keeping the upper 16 bits (what some converters do) is a cast by
    truncation, not round-to-nearest-even."""
    x = torch.randn(64, 96)
    bits = (x.view(torch.int32) >> 16).to(torch.int16)
    cut = bits.view(torch.bfloat16)
    assert not torch.equal(cut, x.to(torch.bfloat16))   # the two roundings differ somewhere
    a = _save_st({"w": x}, tmp_path / "a.safetensors")
    b = _save_st({"w": cut}, tmp_path / "b.safetensors")
    (e,) = diff_models(a, b).entries
    assert e.verdict.kind == "cast" and e.verdict.evidence["rounding"] == "truncation"
    assert e.verdict.evidence["rne_mismatch"] > 0


def test_tolerance_makes_a_cast_the_same(pairs, capsys):
    """The issue's first stumble: fp32 against its bf16 save with --rtol 0.004 exits 0, and the
    JSON says which rule each tensor met."""
    a, b = pairs["bf16"]
    assert main(["diff", a, b]) == 1
    capsys.readouterr()
    assert main(["diff", a, b, "--rtol", "0.004", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 0 and doc["tolerance_given"] is True
    rules = {e["name"]: e["verdict"]["rule"] for e in doc["entries"]}
    assert set(rules.values()) <= {"tolerance", "equal"} and "tolerance" in rules.values()
    assert all(not e["verdict"]["differs"] for e in doc["entries"])
    assert doc["verdict"]["kind"] == "cast"
    # a tolerance too tight for bfloat16's rounding: still different
    assert main(["diff", a, b, "--rtol", "0.001"]) == 1


@pytest.mark.parametrize("case,rank,mods", [("lora4", 4, ("q_proj", "v_proj")),
                                            ("lora8", 8, ("q_proj", "v_proj")),
                                            ("lora64", 64, ("down_proj",))])
def test_lora_merge_is_a_low_rank_update(pairs, case, rank, mods):
    r = diff_models(*pairs[case])
    low = _of(r, "low_rank")
    assert sorted(e.name for e in low) == sorted(
        f"model.layers.{i}.{'mlp' if m == 'down_proj' else 'self_attn'}.{m}.weight"
        for i in range(LAYERS) for m in mods)
    for e in low:
        est = e.verdict.evidence["rank"]
        assert est["rank"] == rank and est["stage"] == "sketch"
        assert est["explained"] > 0.999
        assert est["sketch"] < 2 * rank + 16   # a small sketch, never a full decomposition
    assert {e.verdict.kind for e in r.entries} == {"identical", "low_rank"}
    assert r.verdict.kind == "low_rank"
    names = " and ".join(f"{'mlp' if m == 'down_proj' else 'self_attn'}.{m}" for m in mods)
    assert r.verdict.text.startswith(f"B is A plus a rank-{rank} update on {names} of all "
                                     f"{LAYERS} layers (")
    changed = sum(e.b.numel for e in low)
    assert r.verdict.params_changed == changed
    # what the adapter held: r·(out + in) per adapted matrix
    assert r.verdict.evidence["factor_params"] == sum(rank * sum(e.b.shape) for e in low)
    assert f"{100 * changed / r.verdict.params:.1f}% of parameters changed" in r.verdict.text


def test_full_rank_fine_tune_is_never_low_rank(pairs):
    r = diff_models(*pairs["finetune"])
    kinds = {e.verdict.kind for e in r.entries}
    assert "low_rank" not in kinds and "unrelated" not in kinds and "reinitialised" not in kinds
    assert kinds <= {"changed", "within_tolerance", "identical"}
    for e in r.entries:
        if len(e.b.shape) == 2:
            assert e.verdict.evidence["rank"]["rank"] > 64   # the sample is (nearly) full rank
    assert r.verdict.kind == "fine_tune" and r.verdict.text.startswith("B is a fine-tune of A")


@pytest.mark.parametrize("case,amount", [("prune30", 0.3), ("prune90", 0.9)])
def test_pruned_with_new_sparsity(pairs, case, amount):
    a, b = pairs[case]
    r = diff_models(a, b)
    pruned = _of(r, "pruned")
    assert sorted(e.name for e in pruned) == sorted(
        e.name for e in r.entries if _is_linear(e.name, ("q_proj", "up_proj")))
    from safetensors.numpy import load_file
    sb = load_file(b)
    for e in pruned:
        truth = float((sb[e.name] == 0).mean())
        assert e.verdict.evidence["sparsity"] == pytest.approx(truth, abs=1e-12)
        assert abs(truth - amount) < 1e-3
    assert {e.verdict.kind for e in r.entries} == {"identical", "pruned"}
    assert r.verdict.kind == "pruned" and "sparsity" in r.verdict.text


@pytest.mark.parametrize("case,scheme", [("int8", "qint8 per-channel-affine"), ("q8_0", "q8_0"),
                                         ("q4_0", "q4_0")])
def test_quantized_within_a_step(pairs, case, scheme):
    """torch.ao per-channel int8 (a torch zip) and gguf-py's Q8_0/Q4_0 (a GGUF) of the same
    weights, against the float32 safetensors: every element within one step of its scheme."""
    r = diff_models(*pairs[case])
    quant = _of(r, "quantized")
    assert sorted(e.name for e in quant) == sorted(e.name for e in r.entries if _is_linear(e.name))
    for e in quant:
        q = e.verdict.evidence["quant"]
        assert q["scheme"] == scheme and q["outside_step"] == 0
        # rounding to the nearest level: half a step (plus float16 scales); q4_0's clamped edge
        # reaches a whole step
        assert q["max_error_steps"] <= (1.0625 if case == "q4_0" else 0.5625)
    others = {e.verdict.kind for e in r.entries if not _is_linear(e.name)}
    assert others == {"identical"}
    assert r.verdict.kind == "quantized"
    assert r.verdict.text.startswith(f"B is A quantized to {scheme}")


def test_a_fine_tune_then_quantized_is_not_within_a_step(pairs, tmp_path):
    """What must not be claimed: the fine-tune's weights quantized to Q8_0, against the base."""
    import gguf
    from safetensors.numpy import load_file
    sd = {k: torch.from_numpy(v.copy()) for k, v in load_file(pairs["finetune"][1]).items()}
    b = _gguf(sd, tmp_path / "ft.gguf", gguf.GGMLQuantizationType.Q8_0)
    r = diff_models(pairs["finetune"][0], b)
    assert not _of(r, "quantized")
    assert r.verdict.kind == "fine_tune"


def test_reinitialised_head(pairs):
    r = diff_models(*pairs["reinit_head"])
    (head,) = _of(r, "reinitialised")
    assert head.name == "lm_head.weight"
    assert head.verdict.evidence["init"].startswith("kaiming_uniform")
    assert abs(head.verdict.evidence["cosine"]) < 0.05
    assert {e.verdict.kind for e in r.entries if e is not head} == {"identical"}
    assert r.verdict.text.startswith("B is A with a re-initialised lm_head (")


def test_unrelated_models_of_one_architecture(pairs):
    r = diff_models(*pairs["unrelated"])
    kinds = {e.verdict.kind for e in r.entries}
    assert "changed" not in kinds and "low_rank" not in kinds   # never "a fine-tune"
    assert r.verdict.kind == "unrelated"
    assert r.verdict.text.startswith("B and A are unrelated models of the same architecture")


def test_renamed_and_resaved(pairs):
    r = diff_models(*pairs["renamed"])
    assert r.a_format != r.b_format
    assert {e.verdict.kind for e in r.entries} == {"renamed", "identical"}
    assert r.verdict.kind == "renamed" and r.verdict.params_changed == 0
    assert r.verdict.text == (f"B is A with {r.counts['renamed']} tensors renamed (same values), "
                              f"re-saved as {r.b_format}")


def test_scaled(tmp_path):
    x = torch.randn(48, 80)
    a = _save_st({"w": x}, tmp_path / "a.safetensors")
    b = _save_st({"w": x * 0.5}, tmp_path / "b.safetensors")   # exact: a power of two
    c = _save_st({"w": x * 1.37}, tmp_path / "c.safetensors")  # rounded in float32
    for path, factor in ((b, 0.5), (c, 1.37)):
        (e,) = diff_models(a, path).entries
        assert e.verdict.kind == "scaled"
        assert e.verdict.evidence["scale"] == pytest.approx(factor, rel=1e-6)


def test_cli_json_and_groups(pairs, capsys):
    a, b = pairs["lora8"]
    assert main(["diff", a, b, "--json", "--by", "module", "--top", "3"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"]["kind"] == "low_rank" and doc["verdict"]["evidence"]["ranks"] == [8]
    # --top ranks the changed groups: the two adapted projections, no unchanged group after them
    assert [g["key"] for g in doc["groups"]] in (["self_attn.q_proj", "self_attn.v_proj"],
                                                 ["self_attn.v_proj", "self_attn.q_proj"])
    assert all(g["share_changed"] == 1.0 and g["params_changed"] == g["params"]
               for g in doc["groups"])
    for e in doc["entries"]:
        assert e["verdict"]["kind"] == "low_rank" and e["verdict"]["rule"] == "differs"
        assert e["verdict"]["evidence"]["rank"]["rank"] == 8
    assert main(["diff", a, b]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[2].startswith("verdict B is A plus a rank-8 update")
    assert "18.5% of 3,196,800 parameters changed" in out


def test_cosine_is_one_for_identical_with_and_without_by(pairs, capsys):
    a, _ = pairs["lora8"]
    for extra in ([], ["--by", "layer"]):
        assert main(["diff", a, a, *extra]) == 0
        rows = [line.split() for line in capsys.readouterr().out.splitlines()
                if line.startswith("same ")]
        assert rows and all(r[-1] == "1" for r in rows), rows


def test_diff_argument_errors_are_one_line(pairs, capsys):
    a, b = pairs["lora8"]
    assert main(["diff", a, b, "--atol", "abc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # the command's own line and the CLI's hint (cli._Parser), never a usage block
    assert len(err) == 2 and "atol must be a number" in err[0] and "usage" not in " ".join(err)
    assert main(["diff", a, b, "--fetch-budget", "lots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "expected bytes like 512M or 4G" in err[0]


def test_tui_shows_the_pair_verdict_and_each_tensors(pairs):
    """The TUI diff screen at 80x24: the pair's verdict on top, each tensor's in its row."""
    import asyncio
    from helpers import settle
    from tensorscope.tui.app import make_app
    from tensorscope.tui.screens.diff import DiffScreen
    from test_tui import static_text

    async def run():
        app = make_app(*pairs["lora8"])
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            screen = app.screen
            assert isinstance(screen, DiffScreen)
            top = static_text(screen, "#diff-verdict")
            assert top.startswith("B is A plus a rank-8 update on")
            assert screen.query_one("#diff-verdict").size.height <= 2
            table = screen.query_one("#diff-table")
            rows = [[str(c) for c in table.get_row_at(r)] for r in range(table.row_count)]
            verdicts = {r[1]: r[3] for r in rows}
            assert verdicts["model.layers.0.self_attn.q_proj.weight"].startswith(
                "low-rank update: rank 8")
            assert verdicts["model.norm.weight"] == "identical"
    asyncio.run(run())


def _fused_qkv(sd):
    out = {}
    for k, v in sd.items():
        if ".self_attn.q_proj." in k:
            ks = [k.replace("q_proj", p) for p in ("q_proj", "k_proj", "v_proj")]
            out[k.replace("q_proj", "qkv_proj")] = torch.cat([sd[x] for x in ks], 0)
        elif ".self_attn.k_proj." not in k and ".self_attn.v_proj." not in k:
            out[k] = v
    return out


def test_fused_qkv_against_split_projections(pairs, tmp_path):
    """A merged QKV in one file against split q/k/v in the other: the same weights, when the
    rows match (both ways round); a LoRA on q_proj is then seen in q's rows only."""
    from safetensors.numpy import load_file
    base, lora = pairs["lora8"]
    sd = {k: torch.from_numpy(v.copy()) for k, v in load_file(base).items()}
    fused = _save_st(_fused_qkv(sd), tmp_path / "fused.safetensors")
    for a, b in ((fused, base), (base, fused)):
        r = diff_models(a, b)
        assert r.counts["added"] == r.counts["removed"] == 0
        assert r.exit_code == 0 and r.verdict.kind == "identical"
        rows = [e for e in r.entries if any("fused" in c for c in e.changes)]
        assert len(rows) == 3 * LAYERS
        sliced = [e.name_a if a == fused else e.name_b for e in rows]
        assert "model.layers.0.self_attn.qkv_proj.weight[0:384]" in sliced
        assert "model.layers.1.self_attn.qkv_proj.weight[768:1152]" in sliced
    lsd = {k: torch.from_numpy(v.copy()) for k, v in load_file(lora).items()}
    r = diff_models(fused, _save_st(lsd, tmp_path / "lora_split.safetensors"))
    low = sorted(e.name_b for e in _of(r, "low_rank"))
    assert low == sorted(f"model.layers.{i}.self_attn.{m}_proj.weight"
                         for i in range(LAYERS) for m in "qv")
    assert all(e.verdict.evidence["rank"]["rank"] == 8 for e in _of(r, "low_rank"))


def test_fetch_budget_flag_lets_a_url_diff_read_its_tensors(pairs, capsys, monkeypatch):
    """`diff URL local` of a file larger than the fetch budget: a clear error naming the flag's
    way out, and with --fetch-budget the diff reads what it must (the environment untouched)."""
    import os
    from http_server import Server
    a, b = pairs["lora8"]
    monkeypatch.delenv("TENSORSCOPE_FETCH_BUDGET", raising=False)
    with Server(os.path.dirname(b)) as srv:
        url = srv.url(os.path.basename(b))
        size = os.path.getsize(b)
        assert main(["diff", a, url, "--fetch-budget", str(size // 4)]) == 2
        err = capsys.readouterr().err
        assert "fetch budget" in err and "--fetch-budget" in err
        assert len(err.strip().splitlines()) == 1
        assert main(["diff", a, url, "--fetch-budget", str(2 * size), "--json"]) == 1
        doc = json.loads(capsys.readouterr().out)
        assert doc["verdict"]["kind"] == "low_rank"
    assert "TENSORSCOPE_FETCH_BUDGET" not in os.environ


def test_lora_on_a_convolution_is_low_rank_as_out_by_in_kh_kw(tmp_path):
    """peft's LoRA on a Conv2d factors the kernel as (out, r) x (r, in·kh·kw): the rank test
    reads a conv kernel as that matrix."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(0)
    net = torch.nn.Sequential()
    net.add_module("conv", torch.nn.Conv2d(32, 96, 3))
    net.add_module("head", torch.nn.Conv2d(96, 8, 1))
    base = {k: v.detach().clone() for k, v in net.state_dict().items()}
    cfg = LoraConfig(r=4, lora_alpha=4, target_modules=["conv"], init_lora_weights=False)
    merged = get_peft_model(copy.deepcopy(net), cfg).merge_and_unload()
    a = _save_st(base, tmp_path / "a.safetensors")
    b = _save_st({k: v.detach().clone() for k, v in merged.state_dict().items()},
                 tmp_path / "b.safetensors")
    r = diff_models(a, b)
    kinds = {e.name: e.verdict.kind for e in r.entries}
    assert kinds == {"conv.weight": "low_rank", "conv.bias": "identical",
                     "head.weight": "identical", "head.bias": "identical"}
    (e,) = _of(r, "low_rank")
    assert e.verdict.evidence["rank"]["rank"] == 4


def test_a_large_reinitialised_head_is_not_an_unrelated_model(tmp_path):
    """A small model whose head holds most parameters, re-initialised: still "A with a
    re-initialised head", since its other matrices keep A's values; two fresh inits of a plain
    torch MLP are unrelated (their biases included), never a fine-tune."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 48),
                              torch.nn.ReLU(), torch.nn.Linear(48, 4000))
    a = _save_st(_sd(net), tmp_path / "a.safetensors")
    head = copy.deepcopy(net)
    head[4].reset_parameters()
    b = _save_st(_sd(head), tmp_path / "b.safetensors")
    r = diff_models(a, b)
    assert r.verdict.kind == "reinitialised", r.verdict.text
    assert r.verdict.text.startswith("B is A with a re-initialised 4 (")
    torch.manual_seed(1)
    twin = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 48),
                               torch.nn.ReLU(), torch.nn.Linear(48, 4000))
    r = diff_models(a, _save_st(_sd(twin), tmp_path / "twin.safetensors"))
    assert r.verdict.kind == "unrelated"
    assert {e.verdict.kind for e in r.entries} <= {"reinitialised", "unrelated"}


def test_within_tolerance_is_said_so_and_not_a_change(tmp_path, capsys):
    """Values that differ by less than the tolerance: "same within tolerance", exit 0, nothing
    else claimed (not a low-rank update, not a fine-tune)."""
    x = torch.randn(64, 64, dtype=torch.float64)
    a = _save_st({"w": x}, tmp_path / "a.safetensors")
    b = _save_st({"w": x * (1 + 1e-9 * torch.randn(64, 64, dtype=torch.float64))},
                 tmp_path / "b.safetensors")
    r = diff_models(a, b)
    (e,) = r.entries
    assert e.status == "same" and e.verdict.kind == "within_tolerance"
    assert e.verdict.rule == "tolerance" and not e.verdict.differs and r.exit_code == 0
    assert r.verdict.text.startswith("B is A within tolerance: 1 tensor differs")
    assert r.verdict.params_changed == 0
    assert main(["diff", a, b, "--atol", "0", "--rtol", "0"]) == 1
    capsys.readouterr()


def _q4_k_blocks(x: np.ndarray) -> np.ndarray:
    """Q4_K blocks of float32 rows, quantized the way llama.cpp's quantize_row_q4_K_ref
    finishes (per 32-value sub-block a scale and a min; both rounded to 6 bits against the
    super-block's float16 d and dmin; the values re-quantized with the rounded ones and clamped
    to 0..15), without its iterative search. gguf-py has no Q4_K quantizer; its dequantize is the
    oracle that these bytes are Q4_K."""
    v = x.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(v.min(axis=2), 0)
    scale = (v.max(axis=2) - lo) / 15
    d = (scale.max(axis=1) / 63).astype(np.float16)
    dmin = ((-lo).max(axis=1) / 63).astype(np.float16)
    df, mf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.rint(np.where(df > 0, scale / df, 0)), 0, 63).astype(np.uint8)
        mn = np.clip(np.rint(np.where(mf > 0, -lo / mf, 0)), 0, 63).astype(np.uint8)
        step = (df * sc)[:, :, None]
        q = np.where(step > 0, np.rint((v + (mf * mn)[:, :, None]) / step), 0)
    q = np.clip(q, 0, 15).astype(np.uint8)
    packed = np.zeros((v.shape[0], 12), np.uint8)
    packed[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    qs = np.zeros((v.shape[0], 128), np.uint8)
    for c in range(4):   # value 64c + 32n + l is nibble n of qs[32c + l]
        qs[:, 32 * c:32 * c + 32] = q[:, 2 * c] | (q[:, 2 * c + 1] << 4)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                          packed, qs], axis=1)
    return out.reshape(x.shape[0], -1)


def test_q4_k_within_its_bound_and_a_changed_model_not(tmp_path):
    import gguf
    torch.manual_seed(3)
    w = torch.randn(64, 512) * 0.05
    x = w.numpy()
    blocks = _q4_k_blocks(x)
    deq = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_K)
    assert deq.shape == x.shape and np.abs(deq - x).max() < 0.05   # the layout gguf-py reads
    a = _save_st({"w": w, "u": w + 0.02 * torch.randn(64, 512)}, tmp_path / "a.safetensors")
    g = gguf.GGUFWriter(str(tmp_path / "b.gguf"), "llama")
    for name in ("w", "u"):
        g.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    r = diff_models(a, str(tmp_path / "b.gguf"))
    kinds = {e.name: e.verdict.kind for e in r.entries}
    assert kinds == {"w": "quantized", "u": "changed"}, kinds   # u's blocks are w's, not u's
    q = next(e for e in r.entries if e.name == "w").verdict.evidence["quant"]
    assert q["scheme"] == "q4_k" and q["outside_twice"] == 0 and q["outside_step"] == 0


def test_torch_ao_dynamic_per_channel_int8_aligned_and_quantized(tmp_path):
    """torch.ao.quantization.quantize_dynamic with the per-channel qconfig: the Linear weights
    live in packed params (``0._packed_params._packed_params.0``), which a loader hands back as
    ``0.weight``: aligned with the float model's names, each weight quantized within a step."""
    import warnings
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    torch.save(m.state_dict(), tmp_path / "fp.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = quantize_dynamic(copy.deepcopy(m), {torch.nn.Linear: per_channel_dynamic_qconfig},
                             dtype=torch.qint8)
        torch.save(q.state_dict(), tmp_path / "dyn.pt")
    r = diff_models(tmp_path / "fp.pt", tmp_path / "dyn.pt")
    kinds = {e.name: e.verdict.kind for e in r.entries}
    assert kinds["0.weight"] == kinds["2.weight"] == "quantized"
    assert kinds["0.bias"] == kinds["2.bias"] == "identical"
    assert {k for n, k in kinds.items() if "scale" in n or "zero_point" in n} == {"added"}
    assert r.verdict.text.startswith(
        "B is A quantized to qint8 per-channel-affine; 4 tensors added")
