"""Baselines through the CLI: --write-baseline records the findings with their files' sha256;
--baseline then fails only on findings it does not hold (file hash + rule + location), so a changed
file is judged again and a moved one is not."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import zipfile

import pytest
import torch

from tensorscope.cli import main


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo tensorscope-pwned",))   # never run: the file is only scanned


def _commented_pt(path, comment: bytes):
    torch.save({"w": torch.zeros(2)}, path)
    with zipfile.ZipFile(path, "a") as z:
        z.comment = comment


@pytest.fixture()
def repo(tmp_path, monkeypatch):
    m = tmp_path / "models"
    m.mkdir()
    (m / "evil.pkl").write_bytes(pickle.dumps(_Evil(), protocol=4))
    _commented_pt(m / "c.pt", b"exported by ci")
    (m / "pipe.pkl").write_bytes(b"\x80\x02cmylib.models\nPipeline\n)\x81}b.")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(capsys, *args):
    code = main(["scan", "--no-config", *args, "--json"])
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out.strip() else None, out.err


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_write_baseline_records_hashes(repo, capsys):
    code, doc, _ = run(capsys, "models", "--write-baseline", "base.json")
    assert code == 1   # writing a baseline does not change the verdict
    base = json.loads((repo / "base.json").read_text())
    assert base["schema"] == "tensorscope.scan/1"
    assert sorted(f["rule"] for f in base["findings"]) == sorted(f["rule"] for f in doc["findings"])
    files = {f["file"] for f in base["findings"]}
    assert files == set(base["hashes"]) and len(files) == 3
    for f in files:
        assert base["hashes"][f] == "sha256:" + sha(f)


def test_baseline_hides_old_findings_not_new_ones(repo, capsys):
    run(capsys, "models", "--write-baseline", "base.json")
    code, doc, _ = run(capsys, "models", "--baseline", "base.json")
    assert code == 0 and doc["findings"] == []
    assert len(doc["suppressed"]) == 3
    assert {s["suppression"]["kind"] for s in doc["suppressed"]} == {"baseline"}
    # a new file with a new finding fails the gate; the old ones stay accepted
    (repo / "models" / "new.pkl").write_bytes(pickle.dumps(_Evil(), protocol=2))
    code, doc, _ = run(capsys, "models", "--baseline", "base.json")
    assert code == 1
    assert [f["file"] for f in doc["findings"]] == ["models/new.pkl"]
    assert len(doc["suppressed"]) == 3


def test_changed_file_is_judged_again(repo, capsys):
    run(capsys, "models", "--write-baseline", "base.json")
    # the same rule at the same offset, other bytes: the baseline no longer speaks for the file
    _commented_pt(repo / "models" / "c.pt", b"exported by cj")
    code, doc, _ = run(capsys, "models", "--baseline", "base.json", "--fail-on", "low")
    assert code == 1
    assert [(f["file"], f["rule"]) for f in doc["findings"]] == [("models/c.pt", "zip.comment")]
    # a file moved unchanged keeps its accepted findings
    (repo / "moved").mkdir()
    shutil.move(repo / "models" / "evil.pkl", repo / "moved" / "evil.pkl")
    code, doc, _ = run(capsys, "moved", "--baseline", "base.json")
    assert code == 0 and [s["file"] for s in doc["suppressed"]] == ["moved/evil.pkl"]


def test_baseline_update_and_parallel(repo, capsys):
    run(capsys, "models", "--write-baseline", "base.json")
    (repo / "models" / "new.pkl").write_bytes(pickle.dumps(_Evil(), protocol=2))
    code, doc, _ = run(capsys, "models", "--baseline", "base.json", "--write-baseline", "b2.json",
                       "--jobs", "2")
    assert code == 1 and len(doc["findings"]) == 1
    code, doc, _ = run(capsys, "models", "--baseline", "b2.json", "--jobs", "2")
    assert code == 0 and len(doc["suppressed"]) == 4


def test_baseline_must_be_a_report_with_hashes(repo, capsys):
    main(["scan", "--no-config", "models", "--json", "--output", "plain.json"])
    capsys.readouterr()
    for bad, why in (("plain.json", "--write-baseline"), ("missing.json", "no such baseline")):
        code, doc, err = run(capsys, "models", "--baseline", bad)
        assert code == 2 and doc is None and why in err and len(err.strip().splitlines()) == 1
    (repo / "junk.json").write_text("[1, 2]")
    code, _, err = run(capsys, "models", "--baseline", "junk.json")
    assert code == 2 and "not a tensorscope scan report" in err
