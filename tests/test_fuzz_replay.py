"""fuzz/replay.py: the sanitizer job's replay of an atheris corpus (one run per input, a count per
outcome, exit 1 on any exception that escapes the harness)."""
import importlib.util
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"


@pytest.fixture()
def replay(monkeypatch):
    monkeypatch.syspath_prepend(str(FUZZ))
    spec = importlib.util.spec_from_file_location("fuzz_replay", FUZZ / "replay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_replays_every_input_of_a_folder(replay, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "braces").write_bytes(b"}" * 3000)          # the input that timed out under ASan
    (corpus / "empty").write_bytes(b"")
    (corpus / "proto2").write_bytes(b"\x80\x02K\x01.")
    assert replay.main(["pickle_vm", str(corpus)]) == 0
    out = capsys.readouterr().out
    assert "3 inputs" in out and "0 failed" in out


def test_an_escaping_exception_fails_the_replay(replay, tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad"
    bad.write_bytes(b"x")

    def boom(target, data):
        raise AssertionError("the compiled listing differs from the Python one")
    monkeypatch.setattr(sys.modules["fuzzlib"], "exercise_bytes", boom)
    assert replay.main(["listing", str(bad)]) == 1
    captured = capsys.readouterr()
    assert "1 failed" in captured.out and "differs" in captured.err


def test_unknown_target_is_a_usage_error(replay, capsys):
    assert replay.main(["nosuch", "x"]) == 2
