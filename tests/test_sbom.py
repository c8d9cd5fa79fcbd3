"""scan --sbom: a CycloneDX 1.6 ML-BOM validated by cyclonedx-python-lib's own JSON validator, for
folders of every format made by the real libraries (sharded safetensors and an HF repository from
transformers' save_pretrained, ONNX with external data, torch.save, GGUF, NumPy, pickles), with
hashes equal to hashlib.sha256 of the files and counts equal to what the libraries report."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cyclonedx")
from cyclonedx.schema import SchemaVersion  # noqa: E402
from cyclonedx.validation.json import JsonStrictValidator  # noqa: E402

from tensorscope.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo tensorscope-pwned",))   # never run: the file is only scanned


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """One folder per format, each written by its own library."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    root = tmp_path_factory.mktemp("farm")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    model.save_pretrained(root / "sharded", max_shard_size="30KB")
    model.save_pretrained(root / "hf")
    (root / "hf" / "README.md").write_text(
        "---\nlicense: apache-2.0\nbase_model: openai-community/gpt2\nlibrary_name: transformers\n"
        "datasets:\n- wikitext\n---\n# a tiny GPT-2\n")
    (root / "onnx").mkdir()
    w = numpy_helper.from_array(np.arange(64 * 64, dtype=np.float32).reshape(64, 64), "W")
    b = numpy_helper.from_array(np.ones(64, dtype=np.float16), "B")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                              [w, b])
    m = helper.make_model(graph, producer_name="tensorscope-tests", producer_version="1.2")
    onnx.save_model(m, root / "onnx" / "m.onnx", save_as_external_data=True, location="m.data",
                    size_threshold=0)
    (root / "torch").mkdir()
    torch.save({"a": torch.zeros(3, 4), "b": torch.ones(5, dtype=torch.bfloat16)},
               root / "torch" / "sd.pt")
    (root / "gguf").mkdir()
    shutil.copy(ROOT / "fixtures" / "formats" / "gguf_v3.gguf", root / "gguf" / "m.gguf")
    (root / "npy").mkdir()
    np.save(root / "npy" / "a.npy", np.zeros((7, 3), dtype=np.int16))
    (root / "pickles").mkdir()
    (root / "pickles" / "evil.pkl").write_bytes(pickle.dumps(_Evil(), protocol=4))
    return root


def sbom(tmp_path, capsys, *args):
    out = tmp_path / "bom.json"
    code = main(["scan", "--no-config", *args, "--sbom", str(out), "--json"])
    report = json.loads(capsys.readouterr().out)
    text = out.read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    return code, json.loads(text), report


def props(c, name):
    return [p["value"] for p in c.get("properties", ()) if p["name"] == name]


def prop(c, name):
    (v,) = props(c, name)
    return v


def by_name(bom):
    return {c["name"]: c for c in bom["components"]}


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_every_format_validates_and_hashes_match(farm, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(farm)
    code, bom, report = sbom(tmp_path, capsys, ".")
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.6"
    comps = by_name(bom)
    scanned = {os.path.normpath(p) for p in report["files"]}
    assert {os.path.normpath(n) for n in comps} == scanned   # one component per file scanned
    for name, c in comps.items():
        (h,) = c["hashes"]
        assert h == {"alg": "SHA-256", "content": sha(name)}, name
        assert int(prop(c, "tensorscope:size")) == os.path.getsize(name)
    kinds = {os.path.normpath(n): c["type"] for n, c in comps.items()}
    assert kinds[os.path.join("onnx", "m.data")] == "data"
    assert {k for k, v in kinds.items() if v == "data"} == {os.path.join("onnx", "m.data")}
    assert code == 1   # the pickle's finding


def test_counts_match_the_real_libraries(farm, tmp_path, capsys, monkeypatch):
    import onnx
    import torch
    from safetensors import safe_open
    monkeypatch.chdir(farm)
    _, bom, _ = sbom(tmp_path, capsys, ".")
    comps = {os.path.normpath(n): c for n, c in by_name(bom).items()}

    def check(name, count, params, dtypes, fmt):
        c = comps[os.path.normpath(name)]
        assert c["type"] == "machine-learning-model"
        assert (int(prop(c, "tensorscope:tensors")), int(prop(c, "tensorscope:parameters"))) == \
            (count, params), name
        assert sorted(props(c, "tensorscope:dtype")) == sorted(dtypes), name
        assert prop(c, "tensorscope:format") == fmt

    for shard in sorted(Path("sharded").glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            ts = [f.get_slice(k) for k in f.keys()]
            check(shard, len(ts), sum(int(np.prod(t.get_shape())) for t in ts), {"float32"},
                  "safetensors")
    sd = torch.load("torch/sd.pt", weights_only=True)   # the oracle, on our own benign file
    check("torch/sd.pt", len(sd), sum(t.numel() for t in sd.values()),
          {str(t.dtype).removeprefix("torch.") for t in sd.values()}, "torch-zip")
    m = onnx.load("onnx/m.onnx")
    check("onnx/m.onnx", len(m.graph.initializer),
          sum(int(np.prod(t.dims)) for t in m.graph.initializer), {"float32", "float16"}, "onnx")
    c = comps[os.path.normpath("onnx/m.onnx")]
    assert prop(c, "tensorscope:producer") == "tensorscope-tests 1.2"
    arr = np.load("npy/a.npy")
    check("npy/a.npy", 1, arr.size, {"int16"}, "npy")
    import gguf
    r = gguf.GGUFReader("gguf/m.gguf")
    c = comps[os.path.normpath("gguf/m.gguf")]
    assert int(prop(c, "tensorscope:tensors")) == len(r.tensors)
    assert int(prop(c, "tensorscope:parameters")) == sum(int(t.n_elements) for t in r.tensors)


def test_relations_shards_and_external_data(farm, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(farm)
    _, bom, _ = sbom(tmp_path, capsys, "sharded", "onnx")
    ref = {c["bom-ref"]: os.path.normpath(c["name"]) for c in bom["components"]}
    deps = {ref[d["ref"]]: {ref[x] for x in d.get("dependsOn", ())} for d in bom["dependencies"]}
    index = json.loads(Path("sharded/model.safetensors.index.json").read_text())
    shards = {os.path.join("sharded", f) for f in index["weight_map"].values()}
    assert len(shards) > 1
    assert deps[os.path.join("sharded", "model.safetensors.index.json")] == shards
    assert deps[os.path.join("onnx", "m.onnx")] == {os.path.join("onnx", "m.data")}
    idx = by_name(bom)["sharded/model.safetensors.index.json"]
    assert int(prop(idx, "tensorscope:tensors")) == len(index["weight_map"])


def test_hf_repository_license_base_model_framework(farm, tmp_path, capsys, monkeypatch):
    import transformers
    monkeypatch.chdir(farm)
    _, bom, _ = sbom(tmp_path, capsys, "hf")
    (c,) = bom["components"]
    assert c["name"] == "hf/model.safetensors"
    assert c["licenses"] == [{"license": {"id": "Apache-2.0"}}]
    assert [a["name"] for a in c["pedigree"]["ancestors"]] == ["openai-community/gpt2"]
    assert prop(c, "tensorscope:framework") == f"transformers {transformers.__version__}"
    assert prop(c, "tensorscope:config:architectures") == "GPT2LMHeadModel"
    assert props(c, "tensorscope:model-card:dataset") == ["wikitext"]


def test_model_card_tags_are_never_constructed(tmp_path, capsys, monkeypatch):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    import torch
    repo = tmp_path / "repo"
    repo.mkdir()
    safetensors_torch.save_file({"w": torch.zeros(2)}, str(repo / "model.safetensors"))
    sentinel = tmp_path / "pwned"
    (repo / "README.md").write_text(
        f"---\nlicense: !!python/object/apply:os.system [\"touch {sentinel}\"]\n"
        f"base_model: !!python/name:os.system\nlibrary_name: [1, 2]\n---\n")
    monkeypatch.chdir(tmp_path)
    _, bom, _ = sbom(tmp_path, capsys, "repo")
    (c,) = bom["components"]
    assert not sentinel.exists()
    assert "licenses" not in c and "pedigree" not in c


def test_findings_are_vulnerabilities_with_rule_ids(farm, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(farm)
    _, bom, report = sbom(tmp_path, capsys, "pickles", "npy",
                          "--ignore", "pickle.dangerous-global:pickles/evil.pkl")
    assert report["findings"] == [] and len(report["suppressed"]) == 1
    refs = {c["bom-ref"]: c["name"] for c in bom["components"]}
    (v,) = bom["vulnerabilities"]
    assert v["id"] == report["suppressed"][0]["rule"] == "pickle.dangerous-global"
    assert v["ratings"][0]["severity"] == "critical"
    assert [refs[a["ref"]] for a in v["affects"]] == ["pickles/evil.pkl"]
    assert v["analysis"]["response"] == ["will_not_fix"] and v["analysis"]["detail"]
    _, bom, report = sbom(tmp_path, capsys, "pickles")
    assert [v["id"] for v in bom["vulnerabilities"]] == [f["rule"] for f in report["findings"]]
    assert "analysis" not in bom["vulnerabilities"][0]


def _stable(bom):
    return sorted(json.dumps(c, sort_keys=True) for c in bom["components"]), \
        sorted(json.dumps(d, sort_keys=True) for d in bom["dependencies"]), \
        sorted(json.dumps({k: v for k, v in x.items() if k != "bom-ref"}, sort_keys=True)
               for x in bom.get("vulnerabilities", ()))


def test_jobs_and_dask_give_the_same_bom(farm, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(farm)
    _, seq, r1 = sbom(tmp_path, capsys, ".")
    _, par, r2 = sbom(tmp_path, capsys, ".", "--jobs", "2")
    assert _stable(par) == _stable(seq) and r1["findings"] == r2["findings"]
    pytest.importorskip("distributed")
    _, dsk, r3 = sbom(tmp_path, capsys, ".", "--dask", "local")
    assert _stable(dsk) == _stable(seq) and r3["findings"] == r1["findings"]


def test_resumed_files_keep_their_inventory(farm, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(farm)
    jl = str(tmp_path / "r.jsonl")
    _, first, _ = sbom(tmp_path, capsys, "sharded", "--jsonl", jl)
    recs = [json.loads(line) for line in open(jl)]
    assert all(r["inventory"]["sha256"] == sha(r["path"]) for r in recs if r["scanned"])
    _, again, _ = sbom(tmp_path, capsys, "sharded", "--jsonl", jl, "--resume", jl)
    assert _stable(again) == _stable(first)


def test_sbom_verdicts_equal_the_plain_scan(tmp_path, capsys):
    """--sbom scans each file from the model it opens for the inventory (one parse): the verdicts
    are those of the plain scan, over every fixture of the repository."""
    assert main(["scan", "--no-config", str(ROOT / "fixtures"), "--json"]) in (0, 1)
    plain = json.loads(capsys.readouterr().out)
    main(["scan", "--no-config", str(ROOT / "fixtures"), "--json", "--sbom", str(tmp_path / "b")])
    with_bom = json.loads(capsys.readouterr().out)
    assert with_bom["findings"] == plain["findings"] and with_bom["files"] == plain["files"]


def test_url_components_carry_the_version_not_a_download(farm, tmp_path, capsys):
    """A remote file is read by ranges as the scan reads it; its component names the object's
    ETag instead of a hash that would need the whole object."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from http_server import Server
    from tensorscope import remote
    with Server(farm) as s:
        url = s.url("hf/model.safetensors")
        remote.reset_totals()
        main(["scan", "--no-config", url, "--json"])
        plain = json.loads(capsys.readouterr().out)
        remote.reset_totals()
        _, bom, report = sbom(tmp_path, capsys, url)
        size = (farm / "hf" / "model.safetensors").stat().st_size
    (c,) = bom["components"]
    assert "hashes" not in c and prop(c, "tensorscope:version")
    assert int(prop(c, "tensorscope:size")) == size
    assert int(prop(c, "tensorscope:tensors")) == 28   # GPT-2 with 2 layers, tied head
    # the inventory costs no byte and no request beyond the scan's own
    assert report["fetched"]["bytes"] == plain["fetched"]["bytes"]
    assert report["fetched"]["requests"] == plain["fetched"]["requests"]


def test_sbom_verdicts_equal_the_plain_scan_on_the_attack_corpus(tmp_path, capsys,
                                                                attack_corpus):
    """The same over the attack corpus (tests/make_attack_corpus.py): the one parse shared with
    the inventory judges every hostile file as the plain scan does."""
    corpus = attack_corpus.root
    assert len(attack_corpus.cases) > 250
    main(["scan", "--no-config", str(corpus), "--json"])
    plain = json.loads(capsys.readouterr().out)
    main(["scan", "--no-config", str(corpus), "--json", "--sbom", str(tmp_path / "b.json")])
    with_bom = json.loads(capsys.readouterr().out)
    assert plain["counts"]["critical"] > 250
    assert with_bom["findings"] == plain["findings"] and with_bom["files"] == plain["files"]
    text = (tmp_path / "b.json").read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    bom = json.loads(text)
    assert len(bom["vulnerabilities"]) == len(plain["findings"])
