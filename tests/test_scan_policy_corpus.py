"""Issue 23's corpus: every attack at least MEDIUM (and at its rule's severity) whatever path its
loader takes; the benign shapes written by the real libraries (transformers Trainer, Lightning,
pandas, scikit-learn, skops, torch-model-archiver, torch.onnx.export, torch.Generator ...) at the
"review" their loading deserves, never UNSAFE; no known-inert global ever above LOW."""
from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_attack_corpus  # noqa: E402
import make_benign_corpus  # noqa: E402

from tensorscope import policy  # noqa: E402
from tensorscope.scanning import scan_paths  # noqa: E402
from tensorscope.scanning.report import Severity  # noqa: E402


@pytest.fixture(scope="module")
def attacks(tmp_path_factory):
    out = tmp_path_factory.mktemp("i23_attacks")
    cases = []

    def add(name, data, rule, severity="critical", trigger=None, source=""):
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        cases.append(make_attack_corpus.Case(name, path, rule, severity, trigger, source))
        return path
    make_attack_corpus.issue23_sections(add)
    return cases


@pytest.fixture(scope="module")
def benign(tmp_path_factory):
    return make_benign_corpus.build(tmp_path_factory.mktemp("i23_benign"))


def test_every_attack_is_caught_at_its_severity(attacks):
    assert len(attacks) >= 40
    missed = []
    for case in attacks:
        report = scan_paths(case.path)
        want = Severity.parse(case.severity)
        hit = [f for f in report.findings if f.rule == case.rule and f.severity >= want
               and (case.trigger is None or f.trigger == case.trigger)]
        if not hit or report.severity < Severity.MEDIUM:
            missed.append(f"{case.name}: wanted {case.rule}>={case.severity} {case.trigger}; got "
                          + "; ".join(str(f) for f in report.findings[:3]))
    assert not missed, "\n".join(missed)
    assert all(case.source for case in attacks)


def test_benign_shapes_read_review_not_unsafe(benign):
    bad = []
    for case in benign:
        if case.skipped:
            continue
        report = scan_paths(case.path)
        worst = report.severity if report.findings else Severity.INFO
        if worst > Severity.parse(case.worst) or report.errors:
            bad.append(f"{case.name} ({case.source}): worst {worst}, allowed {case.worst}: "
                       + "; ".join(str(f) for f in report.findings if f.severity > Severity.parse(case.worst))[:600])
        if case.rule and not any(f.rule == case.rule for f in report.findings):
            bad.append(f"{case.name}: wanted {case.rule}, got {[f.rule for f in report.findings]}")
    assert not bad, "\n".join(bad)


def test_trainer_output_folder_is_review(benign):
    case = next(c for c in benign if c.name == "trainer")
    if case.skipped:
        pytest.skip(case.skipped)
    report = scan_paths(case.path)
    assert report.severity == Severity.MEDIUM and not report.unsafe
    names = {f.trigger for f in report.findings}
    assert {"transformers.training_args.TrainingArguments",
            "transformers.trainer_utils.IntervalStrategy"} <= names
    for f in report.findings:
        assert "weights_only=True" in f.message and "safe_globals" in f.message
    files = {Path(f).name for f in report.files}
    assert {"training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth"} <= files


def _import_only(mod: str, name: str) -> bytes:
    return b"\x80\x02c" + mod.encode() + b"\n" + name.encode() + b"\n."


def _known_inert_names():
    for key in policy.FRAMEWORK_PREFIXES:
        if key.endswith("."):
            yield key[:-1], "SomeClass"
        else:
            mod, _, name = key.rpartition(".")
            yield mod, name
    for dotted in sorted(policy.SAFE_GLOBALS):
        mod, _, name = dotted.rpartition(".")
        yield mod, name


def test_no_known_inert_global_is_ever_above_low(tmp_path):
    above = []
    for i, (mod, name) in enumerate(_known_inert_names()):
        p = tmp_path / f"inert{i}.pkl"
        p.write_bytes(_import_only(mod, name))
        report = scan_paths(p)
        if report.findings and report.severity > Severity.LOW:
            above.append(f"{mod}.{name}: " + "; ".join(str(f) for f in report.findings))
    assert not above, "\n".join(above)


@pytest.mark.parametrize("mod,name,category", [
    ("torch._C", "Generator", policy.FRAMEWORK),
    ("numpy.random._pickle", "__generator_ctor", policy.FRAMEWORK),
    ("numpy.random._pcg64", "PCG64", policy.FRAMEWORK),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence", policy.FRAMEWORK),
    ("pathlib", "PosixPath", policy.FRAMEWORK),
    ("torch.optim.lr_scheduler", "partial", policy.DENIED),      # functools.partial, re-exported
    ("torch.optim.lr_scheduler", "LambdaLR", policy.DENIED),     # calls lr_lambda in __init__
    ("torch.nn.modules.module", "_addindent", policy.UNKNOWN),   # a function, not a class
    ("typing", "get_type_hints", policy.DENIED),
    ("transformers.trainer_utils", "IntervalStrategy", policy.UNKNOWN),
])
def test_three_kinds(mod, name, category):
    assert policy.classify(mod, name).category == category


def test_unknown_is_medium_called_or_not(tmp_path):
    for form, body in (("import", _import_only("somepkg.x", "Thing")),
                       ("call", b"\x80\x02csomepkg.x\nThing\n)R.")):
        p = tmp_path / f"{form}.pkl"
        p.write_bytes(body)
        assert scan_paths(p).severity >= Severity.MEDIUM, form


def test_resource_bomb_reports_the_size(tmp_path):
    p = tmp_path / "b.pkl"
    n = 10 ** 12
    p.write_bytes(b"\x80\x02c__builtin__\nbytearray\n\x8a" + bytes([6]) + n.to_bytes(6, "little")
                  + b"\x85R.")
    (f,) = [f for f in scan_paths(p).findings if f.rule == "pickle.resource-bomb"]
    assert f.severity == Severity.HIGH and "bytes" in f.message
    small = tmp_path / "s.pkl"   # an ordinary bytearray(16) is no bomb
    small.write_bytes(b"\x80\x02c__builtin__\nbytearray\nK\x10\x85R.")
    assert not [f for f in scan_paths(small).findings if f.rule == "pickle.resource-bomb"]
    _ = struct
