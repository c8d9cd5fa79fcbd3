"""YAML and JSON configs judged from the values their loaders decode: files written by the real
libraries (Lightning's save_hparams_to_yaml with a pathlib path, OmegaConf.save of a Hydra config,
MLflow's MLmodel) are not above what loading them deserves; OmegaConf itself is the oracle for
the interpolations the scan resolves; the composer never constructs and aliases cost their size."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from tensorscope.scanning import Severity, configs, scan_paths, yaml_tree

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_lightning_hparams_with_a_path_is_known_inert(tmp_path):
    from lightning.pytorch.core.saving import load_hparams_from_yaml, save_hparams_to_yaml
    path = tmp_path / "hparams.yaml"
    save_hparams_to_yaml(path, {"lr": 1e-3, "data_dir": Path("/data/train"), "layers": [1, 2]})
    assert "!!python/object/apply:pathlib.PosixPath" in path.read_text()
    # what loading does: Lightning's full_load refuses the tag (nothing is built)
    with pytest.raises(yaml.constructor.ConstructorError):
        load_hparams_from_yaml(str(path))
    report = scan_paths(path)
    assert report.severity <= Severity.LOW
    [f] = [f for f in report.findings if f.rule == "config.yaml-python-tag"]
    assert f.severity == Severity.LOW and "known inert" in f.message
    assert f.trigger == "pathlib.PosixPath"


def test_a_hydra_config_saved_by_omegaconf_is_clean(tmp_path):
    from omegaconf import OmegaConf
    cfg = OmegaConf.create({
        "model": {"_target_": "torch.nn.Linear", "in_features": 4, "out_features": "${width}"},
        "width": 8,
        "optim": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3},
        "sched": {"_target_": "${optim_sched}", "T_max": 10},
        "optim_sched": "torch.optim.lr_scheduler.CosineAnnealingLR",
        "trainer": {"devices": "${oc.env:NDEV,1}", "max_epochs": 3},
    })
    path = tmp_path / "config.yaml"
    OmegaConf.save(cfg, path)
    report = scan_paths(path)
    assert [str(f) for f in report.findings if f.severity > Severity.INFO] == []


@pytest.mark.parametrize("text, key", [
    ("a: os\nb: system\nt: ${a}.${b}\n", "t"),
    ("x:\n  name: builtins.eval\n  t: ${.name}\n", "x.t"),
    ("x:\n  y:\n    t: ${..n}\n  n: subprocess.run\n", "x.y.t"),
    ("n: [os.system, eval]\nt: ${n[0]}\n", "t"),
    ("t: ${oc.select:missing.key,os.popen}\n", "t"),
    ("a: ${b}\nb: ${c}\nc: pty.spawn\nt: prefix.${a}\n", "t"),
    ("t: \"${oc.decode:'os.system'}\"\n", "t"),
])
def test_interpolations_resolve_as_omegaconf_resolves_them(text, key):
    """OmegaConf is the oracle: the scan's symbolic resolution of a target string equals what
    OmegaConf resolves (nothing here is a callable OmegaConf would import)."""
    from omegaconf import OmegaConf
    expected = OmegaConf.select(OmegaConf.create(text), key)
    [doc] = configs.documents(text)
    path = tuple(key.split("."))
    node = doc.value
    for p in path[:-1]:
        node = node[p]
    got = configs._Resolver(doc.value).resolve(node[path[-1]], path[:-1])
    assert got == {expected}


def test_unknown_resolvers_leave_a_target_unresolved_medium(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  _target_: ${oc.env:CLS}\n  cfg: ${my_resolver:x}\n")
    [f] = scan_paths(path).findings
    assert (f.rule, f.severity) == ("config.hydra-target", Severity.MEDIUM)


def test_the_mlmodel_mlflow_writes_reads_its_loader_module():
    text = (FIXTURES / "mlflow" / "loader_module" / "MLmodel").read_text()
    from tensorscope.scanning.hf_repo import mlmodel_loader
    assert mlmodel_loader(text) == ("my_loader", "code")
    flow = yaml.safe_dump(yaml.safe_load(text), default_flow_style=True)
    assert mlmodel_loader(flow) == ("my_loader", "code")
    assert mlmodel_loader("flavors:\n  python_function:\n    loader_module: null\n") == (None, None)


def test_python_tags_however_spelled_are_the_tag_pyyaml_resolves(tmp_path):
    spellings = [
        "x: !!python/object/apply:os.system [id]\n",
        "x: !<tag:yaml.org,2002:python/object/apply:os.system> [id]\n",
        "%TAG !py! tag:yaml.org,2002:python/\n---\nx: !py!object/apply:os.system [id]\n",
        "%TAG ! tag:yaml.org,2002:\n---\nx: !python/object/apply:os.system [id]\n",
    ]
    for text in spellings:
        # the oracle: PyYAML's own composer resolves every spelling to the same tag
        node = yaml.compose(text, Loader=yaml.SafeLoader).value[0][1]
        assert node.tag == "tag:yaml.org,2002:python/object/apply:os.system"
        path = tmp_path / "h.yaml"
        path.write_text(text)
        [f] = scan_paths(path).findings
        assert (f.severity, f.trigger) == (Severity.CRITICAL, "os.system"), text


def test_aliases_cost_their_size_and_nothing_is_constructed(monkeypatch):
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n"
        for i in range(8))      # 10**9 leaves once expanded
    called = []
    monkeypatch.setattr(yaml.SafeLoader, "construct_document",
                        lambda *a, **k: called.append(1))
    t0 = time.perf_counter()
    [doc] = yaml_tree.compose(laughs)
    assert time.perf_counter() - t0 < 5 and not called
    assert doc.value["i"][0] is doc.value["i"][1]
    cyclic = yaml_tree.compose("a: &a {self: *a, _target_: os.system}\n")[0].value
    assert cyclic["a"]["self"] is cyclic["a"]


def test_json_keys_are_the_decoded_keys(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"x": 1}).replace("}", ', "m": {"\\u005ftarget\\u005f": '
                                                  '"subprocess\\u002ePopen"}}'))
    assert json.loads(path.read_text())["m"] == {"_target_": "subprocess.Popen"}
    [f] = scan_paths(path).findings
    assert (f.rule, f.trigger, f.severity) == ("config.hydra-target", "subprocess.Popen",
                                               Severity.CRITICAL)


def test_broken_yaml_is_not_a_config(tmp_path):
    path = tmp_path / "notes.yaml"
    path.write_text("a: [unclosed\n_target_: os.system\n")
    assert [f for f in scan_paths(path).findings if f.severity > Severity.INFO] == []
    assert os.path.getsize(path) > 0


def test_hostile_config_text_never_raises():
    """Token soup of YAML, JSON and interpolation syntax: a verdict or nothing, never an error."""
    import random
    rng = random.Random(11)
    pieces = ["_target_", ":", " ", "\n", "  ", "- ", "&a ", "*a", "<<: ", "${", "}", ".", "..",
              "os.system", "oc.select:", "get_method:", ",", "'", '"', "\\x2e", "[", "]", "{",
              "%TAG ! tag:yaml.org,2002:\n---\n", "!!python/object/apply:", "!python/name:",
              "py/reduce", "py/repr", "expr_str", "#", "? ", "|\n", "---\n"]

    class Ctx:
        def __init__(self):
            self.findings = []

        def add(self, *a, **k):
            self.findings.append(a)

    for _ in range(1500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        for member in (None, "x/models/model.json", "c.json"):
            configs.check_text(Ctx(), text, member)
