"""Members read as their loader reads them: text members are text, a TorchServe .mar and a skops
archive are known layouts (skops' types judged as skops judges them, against skops itself), a zip
of text files is not a model, an empty file is "empty", ONNX model-local functions are not
custom-op libraries."""
from __future__ import annotations

import io
import operator
import tarfile
import zipfile

import pytest

from tensorscope.scanning import scan_paths
from tensorscope.scanning.report import Severity


def _rules(report):
    return {f.rule for f in report.findings}


def test_skops_untrusted_types_are_what_skops_says(tmp_path):
    sio = pytest.importorskip("skops.io")
    np = pytest.importorskip("numpy")
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer, StandardScaler
    X = np.random.default_rng(0).random((20, 3))
    y = (X[:, 0] > 0.5).astype(int)
    for name, func in (("trusted", np.abs), ("untrusted", operator.abs)):
        p = Pipeline([("s", StandardScaler()), ("f", FunctionTransformer(func)),
                      ("lr", LogisticRegression())]).fit(X, y)
        path = tmp_path / f"{name}.skops"
        sio.dump(p, path)
        theirs = set(sio.get_untrusted_types(file=path))
        report = scan_paths(path)
        ours = {f.trigger for f in report.findings if f.rule == "skops.untrusted-type"}
        assert ours == theirs, (name, ours, theirs)
        assert report.errors == 0
        worst = report.severity if report.findings else Severity.INFO
        assert worst == (Severity.MEDIUM if theirs else Severity.INFO), [str(f) for f in report.findings]


def test_torchserve_custom_handler_is_code_builtin_is_a_layout(tmp_path):
    for handler, files, worst in (
            ("image_classifier", {}, Severity.LOW),
            ("my_handler.py", {"my_handler.py": "import torch\n\ndef handle(data, ctx):\n    return data\n"},
             Severity.MEDIUM)):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("MAR-INF/MANIFEST.json", '{"model": {"handler": "%s"}}' % handler)
            z.writestr("requirements.txt", "certifi\ncharset-normalizer\n")
            for n, text in files.items():
                z.writestr(n, text)
        path = tmp_path / f"{handler}.mar"
        path.write_bytes(buf.getvalue())
        report = scan_paths(path)
        assert "archive.torchserve-handler" in _rules(report)
        assert report.severity == worst, [str(f) for f in report.findings]
        assert not any(f.rule.startswith("pickle.") for f in report.findings)


def test_text_members_of_a_tar_are_text(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for n, data in (("code/requirements.txt", b"certifi==2024.2.2\ncharset-normalizer\n"),
                        ("code/notes", b"cmodule\nname\n(tR")):
            info = tarfile.TarInfo(n)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    path = tmp_path / "model.tar.gz"
    path.write_bytes(buf.getvalue())
    report = scan_paths(path)
    assert not any(f.rule.startswith("pickle.") for f in report.findings), [str(f) for f in report.findings]
    assert report.errors == 0


def test_a_whole_pickle_behind_a_text_name_is_still_judged(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("readme.txt", b"cos\nsystem\n(Vecho hi\ntR.")
    path = tmp_path / "a.zip"
    path.write_bytes(buf.getvalue())
    assert scan_paths(path).severity == Severity.CRITICAL


def test_zip_of_text_files_is_not_a_model(tmp_path):
    path = tmp_path / "docs.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a.txt", "hello\n")
        z.writestr("b/c.yaml", "k: v\n")
    report = scan_paths(path)
    assert _rules(report) == {"file.not-a-model"} and report.severity == Severity.INFO


def test_empty_file_is_empty_not_unsafe(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"")
    report = scan_paths(path)
    (f,) = report.findings
    assert (f.rule, f.severity) == ("file.empty", Severity.MEDIUM) and "empty" in f.message
    assert not report.unsafe and report.exit_code() == 1


def test_onnx_local_functions_are_not_custom_ops(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    fn = helper.make_function("my.local", "Twice", ["x"], ["y"],
                              [helper.make_node("Add", ["x", "x"], ["y"])],
                              [helper.make_opsetid("", 18)])
    graph = helper.make_graph([helper.make_node("Twice", ["a"], ["b"], domain="my.local")], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, functions=[fn], opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("my.local", 1)])
    onnx.checker.check_model(model)
    path = tmp_path / "f.onnx"
    onnx.save(model, path)
    report = scan_paths(path)
    assert "onnx.custom-domain" not in _rules(report) and "onnx.local-functions" in _rules(report)
    # a node of that domain that is not one of the model's functions needs a library
    graph.node.append(helper.make_node("RunShell", ["b"], ["c"], domain="my.local"))
    onnx.save(helper.make_model(graph, functions=[fn], opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("my.local", 1)]), path)
    assert "onnx.custom-domain" in _rules(scan_paths(path))


def test_text_member_that_imports_a_code_running_global_is_judged(tmp_path):
    # pickle.load runs REDUCE before it fails at the missing STOP: text or not, it is a payload
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("notes.txt", b"cos\nsystem\n(Vecho hi\ntR")
    path = tmp_path / "b.zip"
    path.write_bytes(buf.getvalue())
    assert scan_paths(path).severity == Severity.CRITICAL
