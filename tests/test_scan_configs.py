"""Configs that loaders turn into calls: Hydra ``_target_`` keys (NeMo's model_config.yaml inside
a .nemo tar, CVE-2025-23304) and PyYAML python tags (Lightning's hparams.yaml, CVE-2021-4118).
The .nemo files are tars as NeMo writes them (plain or gzipped) around a real torch.save
checkpoint; the text is matched, never loaded by YAML."""
from __future__ import annotations

import io
import tarfile

import pytest
import torch

from tensorscope.cli import main
from tensorscope.scanning import Severity, scan_paths

_BENIGN = (b"name: asr\nsample_rate: 16000\nencoder:\n"
           b"  _target_: nemo.collections.asr.modules.ConformerEncoder\n  feat_in: 80\n"
           b"optim:\n  name: adamw\n  sched:\n    _target_: 'nemo.core.optim.lr_scheduler.CosineAnnealing'\n")


def _nemo(tmp_path, config: bytes, mode: str = "w:", name: str = "m.nemo"):
    ckpt = tmp_path / "model_weights.ckpt"
    torch.save({"encoder.w": torch.zeros(4, 4)}, ckpt)
    path = tmp_path / name
    with tarfile.open(path, mode) as t:
        info = tarfile.TarInfo("./model_config.yaml")
        info.size = len(config)
        t.addfile(info, io.BytesIO(config))
        t.add(ckpt, "./model_weights.ckpt")
    return path


@pytest.mark.parametrize("mode", ["w:", "w:gz"])
def test_a_nemo_file_as_nemo_writes_it_is_clean(tmp_path, mode):
    """The checkpoint inside a tar is a member, not a second view of the file (its EOCD lies in
    zipfile's search window at the tar's end); a gzipped tar is a tarball, not a broken pickle."""
    report = scan_paths(_nemo(tmp_path, _BENIGN, mode))
    assert [f for f in report.findings if f.severity > Severity.INFO] == []
    assert report.exit_code() == 0


@pytest.mark.parametrize("mode", ["w:", "w:gz"])
@pytest.mark.parametrize("target", ["os.system", "builtins.exec", "subprocess.Popen",
                                    "'torch.load'"])
def test_a_hydra_target_that_runs_code_is_critical(tmp_path, mode, target):
    config = _BENIGN + f"payload:\n  _target_: {target}\n  _args_: ['id']\n".encode()
    report = scan_paths(_nemo(tmp_path, config, mode))
    hits = [f for f in report.findings if f.rule == "config.hydra-target"]
    assert [f.trigger for f in hits] == [target.strip("'")]
    assert hits[0].severity == Severity.CRITICAL and "model_config.yaml" in hits[0].member


def test_json_config_targets_and_standalone_files(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model": {"_target_": "os.popen", "cmd": "id"}}')
    report = scan_paths(path)
    assert [(f.rule, f.trigger) for f in report.findings] == [("config.hydra-target", "os.popen")]
    folder = tmp_path / "repo"      # met in a folder walk, a critical config is still reported
    folder.mkdir()
    (folder / "config.json").write_text(path.read_text())
    (folder / "README.md").write_text("# a model\n")
    assert [f.rule for f in scan_paths(folder).findings] == ["config.hydra-target"]


def test_an_interpolated_method_is_judged_like_a_target(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("run:\n  _target_: functools.partial\n  _args_: ['${get_method:os.system}', 'id']\n")
    assert [(f.rule, f.trigger) for f in scan_paths(path).findings] == [
        ("config.hydra-target", "os.system")]


@pytest.mark.parametrize("text,severity", [
    ("lr: 0.1\nmodel: !!python/object/apply:os.system ['id']\n", Severity.CRITICAL),
    ("opt: !!python/name:torch.optim.Adam\n", Severity.HIGH),
    ("x: !python/object/new:subprocess.Popen [['id']]\n", Severity.CRITICAL),
])
def test_yaml_python_tags(tmp_path, text, severity):
    path = tmp_path / "hparams.yaml"
    path.write_text(text)
    [f] = scan_paths(path).findings
    assert (f.rule, f.severity) == ("config.yaml-python-tag", severity)


def test_ordinary_configs_stay_quiet(tmp_path):
    path = tmp_path / "hparams.yaml"
    path.write_text("lr: 0.1\nencoder:\n  _target_: mypkg.layers.Encoder\n"
                    "opt:\n  _target_: functools.partial\n  _args_: ['${get_method:torch.optim.AdamW}']\n"
                    "net:\n  _target_: torch.compile\n"
                    "sched:\n  _target_: torch.optim.lr_scheduler.CosineAnnealingLR\n"
                    "note: 'the word _target_ in prose, and python/name: in a string'\n")
    assert [f for f in scan_paths(path).findings if f.severity > Severity.INFO] == []


def test_inspect_says_what_a_gzipped_tar_is(tmp_path, capsys):
    assert main(["inspect", str(_nemo(tmp_path, _BENIGN, "w:gz"))]) == 2
    assert "compressed tar archive" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["model.sav", "model.pdparams", "model.pdopt"])
def test_pickle_extensions_of_other_frameworks_are_models(tmp_path, name):
    """scikit-learn tutorials' model.sav and PaddlePaddle's paddle.save files are pickles: in a
    folder walk a broken one is reported (a loader would run what precedes the break), and a
    payload is critical."""
    import pickle
    folder = tmp_path / "repo"
    folder.mkdir()
    whole = pickle.dumps({"w": [1.0, 2.0], "b": 3}, protocol=4)
    (folder / name).write_bytes(whole[: len(whole) // 2])
    report = scan_paths(folder)
    assert report.findings and report.severity >= Severity.HIGH
    (folder / name).write_bytes(b"cos\nsystem\n(S'id'\ntR.")
    report = scan_paths(folder)
    assert report.severity == Severity.CRITICAL


def test_jsonpickle_documents(tmp_path):
    """jsonpickle.decode imports what py/object, py/type and py/function name and calls them; the
    fixtures are jsonpickle.encode's own output (fixtures/gen_jsonpickle.py)."""
    import os
    fix = os.path.join(os.path.dirname(__file__), "..", "fixtures", "jsonpickle")
    report = scan_paths(fix)
    got = sorted((os.path.basename(f.file), f.severity, f.trigger) for f in report.findings)
    assert got == [("config.json", Severity.MEDIUM, "gen_jsonpickle.TrainingConfig"),
                   ("reduce_os_system.json", Severity.CRITICAL, "posix.system")]
    path = tmp_path / "x.json"
    path.write_text('{"a": {"py/repr": "os/os.system(\'id\')"}, "b": {"py/type": "builtins.eval"},'
                    ' "c": {"py/mod": "subprocess"}}')
    report = scan_paths(path)
    assert {(f.trigger, f.severity) for f in report.findings} == {
        ("os", Severity.CRITICAL), ("builtins.eval", Severity.CRITICAL),
        ("subprocess", Severity.CRITICAL)}
    path.write_text('{"py_version": "3.11", "object": "py/object", "model": {"type": "llama"}}')
    assert [f.rule for f in scan_paths(path).findings] == ["file.not-a-model"]   # info


@pytest.mark.parametrize("name, text", [
    ("conda.yaml", "channels:\n- conda-forge\ndependencies:\n- python=3.11\n"),
    ("Dockerfile", "channels:\n- x\n"),          # no extension: 'c' + a line no module can be
    ("notes.txt", "cat model.bin | head\nls\n"),
    ("MLmodel", "flavors:\n  python_function:\n    loader_module: mlflow.sklearn\n"),
])
def test_text_named_on_the_command_line_is_not_a_broken_pickle(tmp_path, name, text):
    """GLOBAL is 'c' + two lines: a text file starting with 'c' read leniently as a pickle was a
    broken one with a user class (high). Text named as text, or whose first line cannot be a
    module, is a pickle only when it is a whole one."""
    path = tmp_path / name
    path.write_text(text)
    report = scan_paths(path)
    assert [f for f in report.findings if f.severity > Severity.INFO] == []


def test_a_cut_text_pickle_named_on_the_command_line_is_still_judged(tmp_path):
    path = tmp_path / "payload"
    path.write_bytes(b"cos\nsystem\n(S'id'\ntR")     # no STOP: a loader runs it, then fails
    assert scan_paths(path).severity == Severity.CRITICAL
