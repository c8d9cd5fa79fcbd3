"""A new user's first day (issue 27): each stumble, through the CLI as the user typed it.

Files are made by the real libraries (safetensors, onnx, gguf, h5py where present) in tmp dirs;
the figures are compared with numpy's own over the same values.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tensorscope.render import plural

safetensors_numpy = pytest.importorskip("safetensors.numpy")

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def _llama_like(path, layers=3, seed=0):
    rng = np.random.default_rng(seed)
    sd = {f"model.layers.{i}.self_attn.{p}.weight": rng.standard_normal((4, 4)).astype(np.float32)
          for i in range(layers) for p in ATTN}
    sd["model.norm.weight"] = np.ones(4, dtype=np.float32)
    safetensors_numpy.save_file(sd, str(path))
    return sd


# -- --filter: a substring, a glob when it has glob characters, and a word when nothing matched --

def test_filter_is_a_substring_like_the_tuis(tmp_path, cli):
    sd = _llama_like(tmp_path / "m.safetensors")
    code, out, err = cli("inspect", tmp_path / "m.safetensors", "--filter", "q_proj", "--no-group")
    assert code == 0 and err == ""
    listed = [line.split()[0] for line in out.splitlines()[1:] if line.startswith("model.")]
    assert sorted(listed) == sorted(k for k in sd if "q_proj" in k)


def test_filter_with_glob_characters_is_a_glob(tmp_path, cli):
    sd = _llama_like(tmp_path / "m.safetensors")
    code, out, _ = cli("inspect", tmp_path / "m.safetensors", "--json",
                       "--filter", "model.layers.[01].*.weight")
    names = [t["name"] for t in json.loads(out)["tensors"]]
    assert code == 0 and sorted(names) == sorted(k for k in sd if k.startswith(("model.layers.0.", "model.layers.1.")))


def test_filter_that_matches_nothing_says_so(tmp_path, cli):
    _llama_like(tmp_path / "m.safetensors")
    code, out, err = cli("inspect", tmp_path / "m.safetensors", "--filter", "gate_proj")
    assert code == 1
    assert "no tensor name matches --filter 'gate_proj' (of 13 tensors)" in err
    assert "tensors 0 of 13" in out


# -- --stats on a grouped view: per-group statistics, the group's values as one population ------

def test_grouped_stats_are_per_group(tmp_path, cli):
    sd = _llama_like(tmp_path / "m.safetensors", layers=5)
    code, out, _ = cli("inspect", tmp_path / "m.safetensors", "--group", "--stats", "--json")
    assert code == 0
    groups = {g["pattern"]: g for g in json.loads(out)["groups"]}
    for p in ATTN:
        values = np.concatenate([v.ravel() for k, v in sd.items() if p in k]).astype(np.float64)
        s = groups[f"model.layers.#.self_attn.{p}.weight"]["stats"]
        assert s["numel"] == values.size and s["nan"] == 0 and s["inf"] == 0
        assert s["min"] == pytest.approx(values.min()) and s["max"] == pytest.approx(values.max())
        assert s["mean"] == pytest.approx(values.mean(), abs=1e-6)
        assert s["std"] == pytest.approx(values.std(), rel=1e-5)
    code, out, _ = cli("inspect", tmp_path / "m.safetensors", "--group", "--stats")
    header = out.splitlines()[0].split()
    assert header[-6:] == ["min", "max", "mean", "std", "nan", "inf"]
    row = next(line for line in out.splitlines() if "q_proj.weight ×5" in line)
    q = np.concatenate([v.ravel() for k, v in sd.items() if "q_proj" in k])
    assert f"{q.min():.4g}" in row and f"{q.max():.4g}" in row
    assert "statistics are of each group's values together" in out


# -- metadata as a table a person reads ----------------------------------------------------------

def test_onnx_metadata_reads_as_a_table(tmp_path, cli):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                    helper.make_opsetid("ai.onnx.ml", 3)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    code, out, _ = cli("inspect", tmp_path / "m.onnx")
    assert code == 0
    rows = {line.split(maxsplit=1)[0]: line.split(maxsplit=1)[1] for line in out.splitlines()
            if line and line.split()[0] in ("opsets", "inputs", "outputs", "op_counts")}
    assert rows == {"opsets": "ai.onnx 20, ai.onnx.ml 3", "inputs": "x: float32[batch, 4]",
                    "outputs": "y: float16[batch, 4]", "op_counts": "Mul 1"}
    assert "{'name'" not in out and "opset_import." not in out


def test_gguf_chat_template_in_full_with_show(tmp_path, cli):
    gguf = pytest.importorskip("gguf")
    template = ("{% for message in messages %}\n{{ '<|im_start|>' + message['role'] + '\\n' }}"
                + "{# padding #}" * 40 + "\n{% endfor %}")
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_chat_template(template)
    w.add_tensor("w", np.ones((2, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    code, out, _ = cli("inspect", tmp_path / "m.gguf")
    row = next(line for line in out.splitlines() if "tokenizer.chat_template" in line)
    assert code == 0 and "…" in row and "(--show gguf.kv.tokenizer.chat_template)" in row
    for key in ("tokenizer.chat_template", "gguf.kv.tokenizer.chat_template"):
        code, out, _ = cli("inspect", tmp_path / "m.gguf", "--show", key)
        assert code == 0 and out.rstrip("\n") == template
    code, out, err = cli("inspect", tmp_path / "m.gguf", "--show", "chat")
    assert code == 2 and "no metadata key 'chat' (try: gguf.kv.tokenizer.chat_template" in err


# -- plural forms ----------------------------------------------------------------------------------

def test_plural_forms():
    assert [plural(n, "tensor") for n in (0, 1, 2, 1000)] == [
        "0 tensors", "1 tensor", "2 tensors", "1,000 tensors"]
    assert plural(1, "anomaly", "anomalies") == "1 anomaly"


def test_one_tensor_is_one_tensor(tmp_path, cli):
    safetensors_numpy.save_file({"w": np.ones(3, dtype=np.float32)}, str(tmp_path / "one.safetensors"))
    code, out, _ = cli("inspect", tmp_path / "one.safetensors", "--group")
    assert code == 0
    assert "1 tensor in 1 group: --no-group lists every tensor" in out
    assert "float32: 1 tensor 12 B" in out and "1 tensors" not in out


# -- a Keras .h5 is named, and scan is where to go ---------------------------------------------------

def test_keras_h5_is_named_and_points_to_scan(cli):
    from torch_oracle import FIXTURES
    path = FIXTURES / "keras" / "benign.h5"
    code, out, err = cli("inspect", path)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "an HDF5 file (a Keras .h5 model" in err
    assert "`tensorscope scan`" in err


# -- convert makes its output folder ------------------------------------------------------------

def test_convert_makes_the_output_folder(tmp_path, cli):
    from torch_oracle import FIXTURES
    src = FIXTURES / "torch" / "nested.pth"
    code, out, err = cli("convert", src, str(tmp_path / "out" / "sub") + "/")
    assert code == 0, err
    made = tmp_path / "out" / "sub" / "model.safetensors"
    with safetensors_numpy.safe_open(str(made), "np") as f:
        assert len(list(f.keys())) == 19
    code, _, err = cli("convert", src, tmp_path / "new" / "m.safetensors")
    assert code == 0 and (tmp_path / "new" / "m.safetensors").is_file()


def test_convert_that_fails_leaves_no_folder(tmp_path, cli):
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(b"cos\nsystem\n(S'echo hi'\ntR.")
    code, _, err = cli("convert", evil, str(tmp_path / "out") + "/")
    assert code == 1 and "refused" in err and not (tmp_path / "out").exists()


# -- each command's argument errors are its own --------------------------------------------------

@pytest.mark.parametrize("argv, line", [
    (["inspect", "--bogus", "x"], "tensorscope inspect: error: unrecognized arguments: --bogus"),
    (["diff", "a", "b", "--atol", "abc"],
     "tensorscope diff: error: argument --atol: atol must be a number >= 0 such as 1e-6, got 'abc'"),
    (["scan"], None),
    (["convert", "in.pt"], "tensorscope convert: error: the following arguments are required: OUT"),
])
def test_argument_errors_are_one_line_and_a_hint(argv, line, cli):
    code, out, err = cli(*argv)
    if line is None:   # scan with no path: its own error, the same form
        assert code == 2 and err.startswith("tensorscope scan: error: ")
        return
    assert code == 2 and out == ""
    assert err.splitlines() == [line, f"  (`tensorscope {argv[0]} --help` lists the arguments)"]
    assert "usage:" not in err


# -- scan: one count of files, --jsonl FILE quiet, --resume says what it skipped, SARIF lines ---

def _folder(tmp_path):
    from torch_oracle import FIXTURES
    import shutil
    d = tmp_path / "models"
    shutil.copytree(FIXTURES / "realworld" / "hf" / "gpt2", d / "gpt2")
    (d / "hparams.yaml").write_text("lr: 0.1\nbatch: 8\nmodel: !!python/object/apply:os.system ['id']\n")
    return d


def test_scan_counts_the_files_its_jsonl_records(tmp_path, cli):
    d = _folder(tmp_path)
    jsonl = tmp_path / "report.jsonl"
    code, out, err = cli("scan", d, "--jsonl", jsonl)
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    models = sum(r["scanned"] for r in records)
    assert code == 1 and out == ""   # the records went to the file: stdout stays quiet
    assert f"{len(records)} files scanned ({models} of them model files)" in " ".join(err.split())
    code, out, _ = cli("scan", d, "--json")
    doc = json.loads(out)
    assert doc["files_read"] == len(records) and len(doc["files"]) == models
    code, out, _ = cli("scan", d)
    assert f"{len(records)} files scanned ({models} of them model files)" in " ".join(out.split())


def test_scan_jsonl_file_with_table_asked(tmp_path, cli):
    d = _folder(tmp_path)
    code, out, err = cli("scan", d, "--jsonl", tmp_path / "r.jsonl", "--table")
    assert "config.yaml-python-tag" in out or "hparams.yaml" in out
    assert err == ""


def test_resume_says_what_it_skipped(tmp_path, cli, monkeypatch):
    # relative paths: the message is wrapped at the terminal's width, and a long temporary path
    # (pytest-xdist's workers add a level) would be cut inside the words asserted below
    monkeypatch.chdir(tmp_path)
    d = _folder(tmp_path).relative_to(tmp_path)
    jsonl = Path("report.jsonl")
    cli("scan", d, "--jsonl", jsonl)
    n = len(jsonl.read_text().splitlines())
    (d / "hparams.yaml").write_text("lr: 0.2\n")     # one file changed
    code, out, err = cli("scan", d, "--jsonl", jsonl, "--resume", jsonl)
    said = " ".join(err.split())
    assert f": 1 scanned, {n - 1} unchanged since {jsonl} (not read again" in said
    assert code == 0


def test_sarif_regions_carry_the_line(tmp_path, cli):
    d = _folder(tmp_path)
    code, out, _ = cli("scan", d / "hparams.yaml", "--sarif")
    results = json.loads(out)["runs"][0]["results"]
    tagged = [r for r in results if "(line 3)" in r["message"]["text"]]
    assert tagged, [r["message"]["text"] for r in results]
    for r in tagged:
        assert r["locations"][0]["physicalLocation"]["region"]["startLine"] == 3


def test_a_finding_that_knows_its_line_says_it_in_sarif():
    from tensorscope.scanning.report import Finding, ScanReport, Severity
    f = Finding(Severity.HIGH, "config.hydra-target", "a quoted (line 9) then ours (line 4)", "c.yaml",
                line=7, column=3)
    g = Finding(Severity.HIGH, "config.hydra-target", "a quoted (line 9) then ours (line 4)", "c.yaml")
    regions = [r["locations"][0]["physicalLocation"]["region"]
               for r in ScanReport([f, g], ["c.yaml"]).to_sarif()["runs"][0]["results"]]
    assert regions == [{"startLine": 7, "startColumn": 3}, {"startLine": 4}]
    assert Finding.from_dict(f.to_dict()) == f and "line" not in g.to_dict()


# -- joblib: arrays listed whatever the compression, never dropped in silence, one name ----------

@pytest.mark.parametrize("compress", [0, 3, ("gzip", 3), ("xz", 3), ("bz2", 3)])
def test_joblib_dumps_list_the_same_whatever_the_compression(tmp_path, cli, compress):
    joblib = pytest.importorskip("joblib")
    data = {"coef": np.arange(12.0).reshape(3, 4), "ragged": np.array([np.arange(3), np.arange(5)],
                                                                      dtype=object),
            "labels": np.array(["cat", "dog"]), "mixed": np.array(["a", 1], dtype=object)}
    joblib.dump(data, tmp_path / "m.joblib", compress=compress)
    code, out, _ = cli("inspect", tmp_path / "m.joblib", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["summary"]["format"] == "joblib"
    assert sorted(t["name"] for t in doc["tensors"]) == ["coef", "ragged.4.0", "ragged.4.1"]
    unlisted = [a for a in doc["anomalies"] if a["kind"] == "joblib.array_not_listed"]
    assert len(unlisted) == 3   # ragged (its numbers are listed), labels, mixed
    assert doc["metadata"]["joblib_arrays"] == 4


def test_cost_line_counts_in_the_singular_too():
    from tensorscope import remote
    remote.reset_totals()
    try:
        remote.add_totals(1, 1, 1)
        assert remote.cost_line() == "fetched 1 byte in 1 request from 1 remote object"
        remote.add_totals(99, 2, 1)
        assert remote.cost_line() == "fetched 100 bytes in 3 requests from 2 remote objects"
    finally:
        remote.reset_totals()
