"""Keras model configs: `.keras` archives (config.json) and legacy `.h5` files (a JSON attribute),
as Keras 3 writes them (fixtures/gen_keras.py) and as the published attacks on its loader edit
them. The configs are parsed as JSON and walked; nothing is unmarshalled or imported."""
from __future__ import annotations

import base64
import json
import marshal
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorscope.cli import main
from tensorscope.scanning import Severity, scan_paths
from tensorscope.scanning import keras as keras_scan

KERAS = Path(__file__).resolve().parent.parent / "fixtures" / "keras"


def _rules(path):
    report = scan_paths(path)
    return {(f.rule, f.severity) for f in report.findings}, report


def _edited(tmp_path, name, edit, src="builtin_fn.keras"):
    """A copy of a real Keras archive with its config.json changed, as attackers make them."""
    out = tmp_path / name
    with zipfile.ZipFile(KERAS / src) as zin, zipfile.ZipFile(out, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "config.json":
                data = edit(json.loads(data))
                data = data if isinstance(data, bytes) else json.dumps(data).encode()
            zout.writestr(item, data)
    return out


def _add_layer(layer):
    def edit(config):
        config["config"]["layers"].append(layer)
        return config
    return edit


@pytest.mark.parametrize("name", ["benign.keras", "benign.h5", "builtin_fn.keras",
                                  "hub_module.keras"])
def test_models_keras_writes_are_clean(name):
    found, report = _rules(KERAS / name)
    assert not found and report.exit_code() == 0


@pytest.mark.parametrize("name", ["lambda.keras", "lambda.h5", "keras2_lambda.h5"])
def test_lambda_bytecode_is_critical_with_the_names_it_uses(name):
    report = scan_paths(KERAS / name)
    [f] = [f for f in report.findings if f.rule == "keras.lambda-bytecode"]
    assert f.severity == Severity.CRITICAL
    assert "os" in f.message and "sep" in f.message    # lambda t: t * 2 + len(os.sep)
    if name.endswith(".h5"):   # the offset is where the JSON text starts in the HDF5 file
        raw = (KERAS / name).read_bytes()
        assert raw[f.offset:f.offset + 2] == b'{"'
        assert json.JSONDecoder().raw_decode(raw[f.offset:].decode("latin-1"))[0]["class_name"]


@pytest.mark.parametrize("name,trigger", [
    ("module_os.keras", "os.system"),                                   # CVE-2025-1550
    ("get_file.keras", "keras.utils.get_file"),                         # CVE-2025-8747
    ("unsafe_deser.keras", "keras.config.enable_unsafe_deserialization"),  # CVE-2025-9906
])
def test_published_config_attacks_are_critical(name, trigger):
    report = scan_paths(KERAS / name)
    hits = [f for f in report.findings if f.rule == "keras.dangerous-function"]
    assert [f.trigger for f in hits] == [trigger] and hits[0].severity == Severity.CRITICAL
    assert hits[0].member == "config.json"


@pytest.mark.parametrize("layer,rule,severity", [
    # a nested load with safe_mode off (CVE-2025-9906's second step), through keras.src
    ({"module": "keras.layers", "class_name": "Lambda", "config": {"name": "x", "function": {
        "module": "keras.src.saving.saving_api", "class_name": "function",
        "config": "load_model", "registered_name": "function"},
        "arguments": {"safe_mode": False}}}, "keras.dangerous-function", Severity.CRITICAL),
    # a Python builtin under Keras' "builtins" spelling
    ({"module": "keras.layers", "class_name": "Lambda", "config": {"name": "x", "function": {
        "module": "builtins", "class_name": "function", "config": "exec"}}},
     "keras.dangerous-function", Severity.CRITICAL),
    # a TensorFlow file op called by a Lambda layer
    ({"module": "keras.layers", "class_name": "Lambda", "config": {"name": "x", "function": {
        "module": "tensorflow.io", "class_name": "function", "config": "write_file"}}},
     "keras.dangerous-function", Severity.CRITICAL),
    # a user package's function: imported and called by Keras <= 3.8
    ({"module": "keras.layers", "class_name": "Lambda", "config": {"name": "x", "function": {
        "module": "mypkg.ops", "class_name": "function", "config": "scale"}}},
     "keras.foreign-module", Severity.HIGH),
    # a user package's layer class: imported and built
    ({"module": "mypkg.layers", "class_name": "Scale", "config": {"name": "x"},
      "registered_name": "mypkg>Scale"}, "keras.foreign-module", Severity.MEDIUM),
    # Keras 2's raw function reference
    ({"class_name": "Lambda", "config": {"name": "x", "function": "system", "module": "os",
                                         "function_type": "raw"}},
     "keras.dangerous-function", Severity.CRITICAL),
])
def test_config_objects_are_judged_by_what_the_loader_would_do(tmp_path, layer, rule, severity):
    found, _ = _rules(_edited(tmp_path, "m.keras", _add_layer(layer)))
    assert (rule, severity) in found


def test_bytecode_names_are_read_without_unmarshalling(monkeypatch):
    code = marshal.dumps(compile("__import__('subprocess').run(['id'])", "<x>", "exec"))
    monkeypatch.setattr(marshal, "loads", lambda *a: pytest.fail("unmarshalled"))
    rule, _, message, trigger = keras_scan._bytecode(base64.b64encode(code).decode(), "here")
    assert rule == "keras.lambda-bytecode"
    assert "__import__" in message and "subprocess" in message and "run" in message


@pytest.mark.parametrize("config", [
    b"[" * 100_000 + b"]" * 100_000,                  # nesting past the JSON decoder's depth
    b'{"class_name": "Sequential", "config": ' + b"[" * 50_000,   # cut short
    b"\xff\xfe not json",
    json.dumps({"class_name": "Lambda", "config": {"function": {
        "class_name": "__lambda__", "config": {"code": "!!not base64!!"}}}}).encode(),
])
def test_hostile_configs_give_findings_not_errors(tmp_path, config):
    path = _edited(tmp_path, "h.keras", lambda _: config)
    report = scan_paths(path)      # never raises
    assert report.exit_code() in (0, 1)


def test_hdf5_without_a_keras_config_is_not_called_clean(tmp_path):
    raw = (KERAS / "benign.h5").read_bytes()
    path = tmp_path / "data.h5"
    path.write_bytes(raw.replace(b'"class_name"', b'"klass_name"'))   # no Keras config left
    found, report = _rules(path)
    assert ("hdf5.not-parsed", Severity.MEDIUM) in found and report.exit_code() == 1


def test_hdf5_candidate_budget_is_bounded(tmp_path):
    path = tmp_path / "many.h5"
    path.write_bytes(keras_scan.HDF5_MAGIC + b'{"module"' * (keras_scan.MAX_CANDIDATES + 10))
    report = scan_paths(path)
    assert report.exit_code() == 1      # not every candidate was read: not clean


def test_inspect_names_a_keras_archive(capsys):
    assert main(["inspect", str(KERAS / "benign.keras")]) == 2
    err = capsys.readouterr().err
    assert "Keras archive" in err and "benign.keras" in err


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) |
    st.sampled_from(["Lambda", "__lambda__", "function", "os", "keras.utils", "builtins",
                     "get_file", "system", "raw", "lambda", "code", "module", "class_name"]) |
    st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) |
    st.dictionaries(st.sampled_from(["module", "class_name", "config", "function",
                                     "function_type", "code", "registered_name", "layers"]) |
                    st.text(max_size=4), children, max_size=5),
    max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(doc=_json)
def test_any_json_walks_without_error(doc):
    """Whatever shape a config has, the walk yields well-formed findings and never raises."""
    for rule, variant, message, trigger in keras_scan.findings(doc):
        assert rule in ("keras.lambda-bytecode", "keras.dangerous-function", "keras.foreign-module")
        assert isinstance(message, str) and isinstance(trigger, str)
        assert variant in ("", "function", "class")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 20_000), junk=st.binary(max_size=64), at=st.integers(0, 14_000))
def test_damaged_hdf5_scans_without_error(tmp_path, cut, junk, at):
    """A Keras .h5 cut short or overwritten anywhere: scan reports, never raises."""
    raw = (KERAS / "lambda.h5").read_bytes()
    raw = (raw[:at] + junk + raw[at + len(junk):])[:max(8, cut)]
    path = tmp_path / "d.h5"
    path.write_bytes(raw)
    report = scan_paths(path)
    assert report.exit_code() in (0, 1)
