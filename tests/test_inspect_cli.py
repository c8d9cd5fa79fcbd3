"""`tensorscope inspect` on the shapes of names users have: flat state-dict keys, MoE names with
two indices (thousands of tensors, torch.save), nested containers, names full of escape
sequences; the streamed table, the grouped view, the JSON, and the summary's figures against
torch's own counts."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from torch import nn

import tensorscope
from tensorscope.cli import main
from tensorscope.commands import inspect as inspect_cmd
from tensorscope.render import TextTable, emit_json_stream
from tensorscope.safetext import is_clean, shown

EVIL = "x\x1b]0;t\x07\x1b[2Jy\u202ez"
MARKUP = "[bold]loud[/bold].weight"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
        self.register_buffer("scale", torch.ones(3))
        self.register_buffer("scratch", torch.zeros(5), persistent=False)


def _moe(tmp_path, layers=4, experts=200, skip=()):
    sd = {}
    for layer in range(layers):
        for e in range(experts):
            if e in skip:
                continue
            for p in ("gate", "up", "down"):
                sd[f"model.layers.{layer}.mlp.experts.{e}.{p}_proj.weight"] = torch.zeros(
                    4, 4, dtype=torch.bfloat16)
    sd["model.embed_tokens.weight"] = torch.zeros(10, 4, dtype=torch.bfloat16)
    path = tmp_path / "moe.pt"
    torch.save(sd, path)
    return path, sd


def _run(capsys, *argv):
    code = main(["inspect", *map(str, argv)])
    out = capsys.readouterr()
    assert is_clean(out.out) and is_clean(out.err)
    return code, out.out, out.err


# -- flat state-dict keys --------------------------------------------------------------------------

def test_flat_state_dict_rows_in_order_and_aligned(tmp_path, capsys):
    torch.manual_seed(0)
    sd = Net().state_dict()
    path = tmp_path / "sd.pt"
    torch.save(sd, path)
    code, out, _ = _run(capsys, path, "--no-group")
    assert code == 0
    lines = out.splitlines()
    rows = lines[1:1 + len(sd)]
    assert [r.split()[0] for r in rows] == list(sd)  # torch's keys, in saved order
    header = lines[0]
    params_end = header.index("params") + len("params")  # right-aligned under its header
    for row, (name, t) in zip(rows, sd.items()):
        assert row.split()[1] == str(t.dtype).removeprefix("torch.")
        assert row[:params_end].split()[-1].replace(",", "") == str(t.numel())
    # aligned: every column starts at the header's offset
    for col in ("dtype", "shape"):
        at = header.index(col)
        assert all(r[at - 2:at] == "  " and r[at] != " " for r in rows)
    # a state dict does not say which values are buffers: one count, torch's total
    total = sum(t.numel() for t in sd.values())
    assert f"elements {total}" in out and "parameters" not in out


# -- parameters and buffers ----------------------------------------------------------------------

def test_parameters_and_buffers_of_a_whole_module_match_torch(tmp_path, capsys):
    torch.manual_seed(0)
    net = Net()
    path = tmp_path / "net.pt"
    torch.save(net, path)
    params = sum(p.numel() for p in net.parameters())
    buffers = sum(b.numel() for b in net.buffers())
    code, out, _ = _run(capsys, path)
    assert code == 0
    assert f"parameters {params}   buffers {buffers}   size" in out
    code, out, _ = _run(capsys, path, "--json")
    roles = json.loads(out)["summary"]["by_role"]
    assert roles["parameter"]["params"] == params
    assert sum(v["params"] for k, v in roles.items() if k.startswith("buffer")) == buffers


def test_filter_summary_counts_the_selection_of_the_whole(tmp_path, capsys):
    torch.manual_seed(0)
    net = Net()
    path = tmp_path / "net.pt"
    torch.save(net, path)
    picked = {n: p for n, p in net.named_parameters() if n.startswith("body.0.")}
    all_params = sum(p.numel() for p in net.parameters())
    code, out, _ = _run(capsys, path, "--filter", "body.0.*")
    assert code == 0
    n_all = len(list(net.parameters())) + len(list(net.buffers()))
    nbytes = sum(p.numel() * p.element_size() for p in picked.values())
    assert f"tensors {len(picked)} of {n_all}" in out
    assert f"parameters {sum(p.numel() for p in picked.values())} of {all_params}" in out
    assert f"size {nbytes} B of " in out
    code, out, _ = _run(capsys, path, "--filter", "body.0.*", "--json")
    s = json.loads(out)["summary"]
    assert s["tensors"] == len(picked) and s["bytes"] == nbytes
    assert s["of"]["tensors"] == n_all


# -- MoE names: grouped by default above 2,000 tensors --------------------------------------------

def _expected_groups(sd):
    """The groups, computed from torch's keys with a regex (not tensorscope.grouping)."""
    groups = {}
    for name in sd:
        pattern = re.sub(r"(?<=\.)\d+(?=\.)", "#", name)
        idx = [int(x) for x in re.findall(r"(?<=\.)(\d+)(?=\.)", name)]
        groups.setdefault(pattern, []).append(idx)
    return groups


def test_moe_checkpoint_opens_grouped_with_ranges(tmp_path, capsys):
    path, sd = _moe(tmp_path, layers=4, experts=200, skip={7})
    assert len(sd) > inspect_cmd.GROUP_ABOVE
    code, out, _ = _run(capsys, path)
    assert code == 0
    for pattern, idx in _expected_groups(sd).items():
        if len(idx) == 1:
            continue
        layers, experts = {i[0] for i in idx}, {i[1] for i in idx}
        assert (f"{pattern} ×{len(idx):,}" in out), pattern
        text = (f"layers {min(layers)}–{max(layers)}, experts {min(experts)}–{max(experts)} "
                f"({len(experts)} seen)")
        assert text in out
    assert "--no-group lists every tensor" in out
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" not in out
    # --no-group: every tensor, in saved order
    code, out, _ = _run(capsys, path, "--no-group")
    names = [line.split()[0] for line in out.splitlines()[1:1 + len(sd)]]
    assert names == list(sd)


def test_moe_json_keeps_tensors_and_groups(tmp_path, capsys):
    path, sd = _moe(tmp_path, layers=3, experts=250)
    code, out, _ = _run(capsys, path, "--json")
    doc = json.loads(out)
    with tensorscope.open(path) as model:
        assert doc["tensors"] == [t.to_dict() for t in model.tensors]
    assert [t["name"] for t in doc["tensors"]] == list(sd)
    expected = _expected_groups(sd)
    got = {g["pattern"]: g for g in doc["groups"]}
    assert set(got) == set(expected)
    for pattern, idx in expected.items():
        g = got[pattern]
        assert g["count"] == len(idx)
        first = next(n for n in sd if re.sub(r"(?<=\.)\d+(?=\.)", "#", n) == pattern)
        assert g["first"] == first
        assert g["params"] == sum(sd[n].numel() for n in sd
                                  if re.sub(r"(?<=\.)\d+(?=\.)", "#", n) == pattern)
        for pos, r in enumerate(g["ranges"]):
            values = {i[pos] for i in idx}
            assert (r["min"], r["max"], r["distinct"]) == (min(values), max(values), len(values))
        assert [r["label"] for r in g["ranges"]] == (["layers", "experts"] if idx[0] else [])
    # --no-group: no groups
    code, out, _ = _run(capsys, path, "--json", "--no-group")
    assert "groups" not in json.loads(out)


# -- nested containers ---------------------------------------------------------------------------

def test_nested_containers_group_through_their_path(tmp_path, capsys):
    blocks = [{"attn.q": torch.zeros(2, 2), "mlp": {"up": torch.zeros(3)}} for _ in range(5)]
    path = tmp_path / "nested.pt"
    torch.save({"blocks": blocks, "opt": {"state": {i: {"exp_avg": torch.zeros(2)} for i in range(3)}}},
               path)
    code, out, _ = _run(capsys, path, "--group")
    assert code == 0
    assert "blocks.#.attn.q ×5" in out and "blocks.#.mlp.up ×5" in out
    assert "opt.state.#.exp_avg ×3" in out and "state 0–2" in out and "blocks 0–4" in out


# -- text from the file is evidence ----------------------------------------------------------------

@pytest.mark.parametrize("view", [[], ["--group"], ["--json"]])
def test_escape_sequences_and_markup_in_names_are_shown_not_run(tmp_path, capsys, view):
    sd = {EVIL: torch.zeros(2), MARKUP: torch.zeros(3), "layers.0.\x1b[31mw": torch.zeros(1),
          "layers.1.\x1b[31mw": torch.zeros(1)}
    path = tmp_path / "evil_names.pt"
    torch.save(sd, path)
    code, out, _ = _run(capsys, path, *view)
    assert code == 0
    if view == ["--json"]:
        assert {t["name"] for t in json.loads(out)["tensors"]} == set(sd)
        return
    if not view:
        assert shown(EVIL) in out and "x\\x1b]0;t\\x07\\x1b[2Jy\\u202ez" in out
    assert MARKUP in out  # printed, not interpreted
    assert "layers.#.\\x1b[31mw" in out if view else "layers.1.\\x1b[31mw" in out


def test_globals_outside_the_allowlist_get_one_line(tmp_path, capsys):
    import os

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    path = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(2), "payload": Evil()}, path)
    code, out, _ = _run(capsys, path)
    assert code == 0
    line = [x for x in out.splitlines() if "this file references" in x]
    assert len(line) == 1 and "system" in line[0] and "run `tensorscope scan`" in line[0]
    code, out, _ = _run(capsys, path, "--json")
    refs = json.loads(out)["outside_allowlist"]
    assert [r["category"] for r in refs if r["global"].endswith(".system")] == ["denied"]
    # a plain state dict references nothing outside the allowlist: no line
    torch.save({"w": torch.zeros(2)}, tmp_path / "ok.pt")
    code, out, _ = _run(capsys, tmp_path / "ok.pt")
    assert "this file references" not in out


# -- arguments -----------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["0", "-1", "x"])
def test_limit_must_be_positive(bad, capsys):
    assert main(["inspect", "whatever.pt", "--limit", bad]) == 2
    assert "--limit" in capsys.readouterr().err


def test_limit_shows_n_rows_and_says_how_many_more(tmp_path, capsys):
    path, sd = _moe(tmp_path, layers=1, experts=2)
    code, out, _ = _run(capsys, path, "--limit", "2")
    lines = out.splitlines()
    assert [x.split()[0] for x in lines[1:3]] == list(sd)[:2]
    assert f"… {len(sd) - 2} more rows (--limit)" in out


# -- the streamed writers ------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 2, 3, 2048])
def test_json_stream_is_what_json_dumps_writes(batch, capsys):
    doc = {"a": [1, {"z": 2, "b": None}], "schema": "s", "meta": {"k": "\x1b"}}
    rows = [{"name": f"t{i}", "shape": [i], "x": float(i) / 3} for i in range(7)]
    emit_json_stream(doc, "tensors", iter(rows), batch=batch)
    assert capsys.readouterr().out == json.dumps({**doc, "tensors": rows}, sort_keys=True) + "\n"
    emit_json_stream(doc, "tensors", iter([]), batch=batch)
    assert json.loads(capsys.readouterr().out)["tensors"] == []


def _fixture_models():
    root = Path(__file__).resolve().parent.parent / "fixtures"
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix not in (".py", ".json", ".md", ".txt"):
            try:
                with tensorscope.open(str(path)) as m:
                    yield path, list(m.tensors)
            except tensorscope.TensorscopeError:
                continue


def test_json_text_is_what_the_encoder_writes_for_every_fixture_record():
    """`model.json_text` (the rows' fast path) against the encoder over `to_dict`, on every
    record the fixtures give, plus records with the extras it must hand back (None)."""
    from tensorscope.model import TensorInfo, json_text
    encode = json.JSONEncoder(sort_keys=True, allow_nan=True).encode
    fast = total = 0
    for path, tensors in _fixture_models():
        for t in tensors:
            total += 1
            text = json_text(t)
            if text is not None:
                fast += 1
                assert text == encode(t.to_dict()), (path, t.name)
    assert total and fast > total // 2   # the fast path is the common case
    odd = [TensorInfo("\x1b[31m\u202e é", "float32", (2, 3), extras={"b": [1, "x\n"], "a": True,
                                                                    "c": None, "d": -3}),
           TensorInfo("k", "bfloat16", (), byte_offset=None, path=("a.b", "c"), role="buffer",
                      storage_key="7", file="/p/\u00e9.pt")]
    for t in odd:
        assert json_text(t) == encode(t.to_dict())
    # rows in one call: a record that equals the previous one's kind but for a type (True == 1)
    # is written as the encoder writes it, not with the previous row's text
    from tensorscope.model import json_texts
    a = TensorInfo("a", "uint8", (1,), nbytes=1)
    b = TensorInfo("b", "uint8", (1,), nbytes=True, stride=a.stride)
    object.__setattr__(b, "shape", a.shape)
    assert [x or encode(t.to_dict()) for x, t in zip(json_texts([a, b]), (a, b))] == \
        [encode(a.to_dict()), encode(b.to_dict())]
    for extras in ({"f": 0.5}, {"n": float("nan")}, {"d": {"x": 1}}, {"l": [1.5]}, {1: "x"}):
        assert json_text(TensorInfo("x", "float32", (1,), extras=extras)) is None
    assert json_text(TensorInfo("x", "float32", (1,), has_data=False)) is None


def test_json_texts_rows_of_one_call_are_what_the_encoder_writes():
    """`json_texts` over each fixture's whole listing (consecutive rows share a kind's text;
    torch rows share it across their per-record ``member`` extras), and over records whose
    storage extras differ from the previous row's in location, member type or keys."""
    from tensorscope.model import FrozenDict, TensorInfo, json_texts
    encode = json.JSONEncoder(sort_keys=True, allow_nan=True).encode
    shared = 0
    for path, tensors in _fixture_models():
        for text, t in zip(json_texts(tensors), tensors):
            assert (text or encode(t.to_dict())) == encode(t.to_dict()), (path, t.name)
            shared += text is not None and set(t.extras) == {"location", "member"}
    assert shared    # the fixtures hold torch rows of that kind
    kinds = [{"location": "cpu", "member": "archive/data/0"},
             {"location": "cpu", "member": "a\n\u00e9\x1b"},
             {"location": "cuda:0", "member": "archive/data/2"},
             {"location": "cuda:0", "member": 3},
             {"location": "cuda:0", "member": "m", "error": "e"},
             {"location": None, "member": "m"},
             {"member": "archive/data/5", "location": "cpu"},
             {"location": "cpu", "member": "archive/data/6"}]
    shape = (2, 2)
    records = [TensorInfo(f"t{i}", "float32", shape, extras=FrozenDict(e), storage_key=str(i),
                          byte_offset=64 * i) for i, e in enumerate(kinds)]
    for r in records:
        object.__setattr__(r, "shape", shape)
    assert [x or encode(t.to_dict()) for x, t in zip(json_texts(records), records)] == \
        [encode(t.to_dict()) for t in records]


def test_text_table_folds_long_names_on_a_terminal():
    out = io.StringIO()
    rows = [["a" * 50, "f32", "1"], ["short", "bf16", "22"]]
    widths = TextTable.fit_first([50, 4, 2], total=40)
    TextTable(["name", "dtype", "n"], "llr", widths, fold=True, out=out).write(rows)
    lines = out.getvalue().splitlines()
    assert all(len(x) <= 40 for x in lines)
    w = widths[0]
    assert lines[1].split() == ["a" * w, "f32", "1"]
    assert lines[1][:w] + "".join(lines[2:-1]) == "a" * 50  # the rest on continuation lines
    assert lines[-1].split() == ["short", "bf16", "22"]
    assert TextTable.fit_first([10, 4], total=80) == [10, 4]  # never wider than the names


def test_group_collector_agrees_with_the_one_name_functions():
    """GroupCollector (streaming) and group_key / group_indices / index_ranges (one name at a
    time) group alike: flat keys, nested paths whose keys hold dots, unicode digits (not
    indices), a single-component path that differs from the name."""
    from tensorscope.grouping import (GroupCollector, describe_ranges, group_indices, group_key,
                                      index_ranges)
    items = [("model.layers.3.mlp.experts.17.up_proj.weight", ()),
             ("model.layers.0.mlp.experts.2.up_proj.weight",
              ("model.layers.0.mlp.experts.2.up_proj.weight",)),
             ("model.layers.9.mlp.experts.17.up_proj.weight", ()),
             ("blocks.0.attn.q", ("blocks", "0", "attn.q")),
             ("blocks.4.attn.q", ("blocks", "4", "attn.q")),
             ("x.².w", ()), ("x.1.w", ()), ("alias", ("h.7.w",)), ("alias2", ("h.2.w",)),
             ("h.07.w", ()), ("0.1", ()), ("a..3.", ()), ("9", ()), ("n\0.3.w", ()),
             ("n\0.12.w", ()), ("é.5.w", ()), ("é.51.w", ())]
    c = GroupCollector()
    expect: dict[str, list] = {}
    for name, path in items:
        c.add(name, "float32", (2,), 8, path)
        expect.setdefault(group_key(name, path), []).append((name, group_indices(name, path)))
    got = {g["pattern"]: g for g in c.groups()}
    # add_tensors (the loop inspect runs over records) groups exactly as add
    from tensorscope.model import TensorInfo
    records = GroupCollector()
    records.add_tensors([TensorInfo(name, "float32", (2,), path=path) for name, path in items])
    assert list(records.groups()) == list(c.groups())
    assert got["h.#.w"]["ranges"] == [(2, 7, 2)]   # "07" and "7" are one index
    assert set(got) >= {"a..#.", "#", "#.#"}
    assert set(got) == set(expect)
    for pattern, members in expect.items():
        g = got[pattern]
        assert (g["count"], g["bytes"], g["first"]) == (len(members), 8 * len(members), members[0][0])
        assert g["ranges"] == index_ranges([i for _, i in members])
    assert describe_ranges("model.layers.#.mlp.experts.#.up_proj.weight",
                           got["model.layers.#.mlp.experts.#.up_proj.weight"]["ranges"]) == \
        "layers 0–9 (3 seen), experts 2–17 (2 seen)"
    assert describe_ranges("#.#", got["#.#"]["ranges"]) == "#1 0, #2 1"


# -- the notice while a slow open runs ----------------------------------------------------------------

def test_slow_open_says_what_it_reads_then_wipes_the_line(tmp_path, capsys, monkeypatch):
    """On a terminal an open that takes longer than the notice delay shows ``reading <file> …`` on
    stderr, erased before the table, and the file's name in it is escaped like any other text."""
    import time
    from tensorscope import render
    path, _ = _moe(tmp_path, layers=1, experts=2)
    evil = tmp_path / f"{EVIL}.pt"
    path.rename(evil)
    monkeypatch.setattr(render, "_status_visible", lambda: True)
    monkeypatch.setattr(render, "OPENING_NOTICE_AFTER", 0.0)
    real_open = inspect_cmd.open_model

    def slow_open(p, **kw):
        time.sleep(0.2)     # longer than the (zero) delay: the timer fires during the open
        return real_open(p, **kw)

    monkeypatch.setattr(inspect_cmd, "open_model", slow_open)
    code = main(["inspect", str(evil)])
    out = capsys.readouterr()
    assert code == 0
    assert out.err == f"reading {shown(str(evil))} …\r\x1b[2K"
    assert "\x1b]" not in out.err and "model.layers.0.mlp.experts.1.up_proj.weight" in out.out


def test_no_notice_when_no_terminal_shows_it(tmp_path, capsys, monkeypatch):
    from tensorscope import render
    path, _ = _moe(tmp_path, layers=1, experts=2)
    monkeypatch.setattr(render, "OPENING_NOTICE_AFTER", 0.0)
    assert not render._status_visible()     # captured stderr is no terminal
    assert main(["inspect", str(path)]) == 0
    assert capsys.readouterr().err == ""


_COMPONENTS = ["layer1", "layer2", "conv1", "conv2", "w0", "w1", "0", "1", "12", "07", "a", "b2c",
               "1a", "", "x.9"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_COMPONENTS), min_size=1, max_size=5), min_size=1,
                max_size=40))
def test_grouping_keeps_digits_that_are_not_indices(parts_lists):
    """Digits inside a component (``layer1.0.conv2``: ResNet; ``experts.w0``) belong to the
    pattern: names differing only there are different groups, however the collector's caches
    were filled before (by these names or earlier ones)."""
    from tensorscope.grouping import GroupCollector, group_indices, group_key, index_ranges
    from tensorscope.model import TensorInfo
    names = [".".join(p) for p in parts_lists]
    c = GroupCollector()
    c.add_tensors([TensorInfo(n, "float32", (2,)) for n in names])
    expect: dict[str, list] = {}
    for n in names:
        expect.setdefault(group_key(n), []).append(group_indices(n))
    got = {g["pattern"]: g for g in c.groups()}
    assert set(got) == set(expect)
    for pattern, indices in expect.items():
        assert got[pattern]["count"] == len(indices)
        assert got[pattern]["ranges"] == index_ranges(indices)


def test_resnet_names_keep_their_layer_and_conv_numbers(tmp_path, capsys):
    """torchvision-style names: layer1..layer4 and conv1..conv3 are names, the block index is an
    index (a real torch.save of ResNet-shaped keys)."""
    sd = {f"layer{l}.{b}.conv{c}.weight": torch.zeros(2, 2) for l in (1, 2) for b in range(3)
          for c in (1, 2)}
    path = tmp_path / "resnet.pth"
    torch.save(sd, path)
    code, out, _ = _run(capsys, path, "--group")
    assert code == 0
    rows = [line.split()[0] for line in out.splitlines()[1:5]]
    assert rows == ["layer1.#.conv1.weight", "layer1.#.conv2.weight", "layer2.#.conv1.weight",
                    "layer2.#.conv2.weight"]
    assert "×3" in out and "4 groups" in out
