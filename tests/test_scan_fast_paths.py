"""The scanner's shortcuts must not hide anything: records skipped without a VM run, memoised
policy verdicts, the zip read shared with the parser, real paths derived during the folder walk."""
from __future__ import annotations

import os
import pickle
import zipfile

import pytest

from tensorscope import policy
from tensorscope.scanning import loader, pickles, walk
from tensorscope.scanning import Severity, scan_paths

EVIL_P0 = b"cos\nsystem\n(S'echo pwned'\ntR."   # protocol 0: GLOBAL reads two lines


@pytest.mark.parametrize("data,cannot", [
    (b"little", True),                    # torch's byteorder record: an 'i', no newline
    (b"3\n", True),                       # version record: no importing byte at all
    (b"0826864773560457770000041900002034726582", True),  # serialization id
    (EVIL_P0, False),                     # GLOBAL with its lines
    (b"ios\nsystem\n", False),            # INST reads its names the same way
    (b"cos\n", False),                    # one newline: the name read takes the rest of the data
    (b"xx\ncos", True),                   # 'c' after the last newline: both reads come back short
    (b"\x93", False), (b"\x82\x01", False), (b"\x83", False), (b"\x84", False),  # STACK_GLOBAL, EXT*
])
def test_cannot_import(data, cannot):
    assert loader._cannot_import(data) is cannot


def _torch_like_zip(path, extra_name: str, extra: bytes):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"a": 1}, protocol=2))
        z.writestr("archive/byteorder", b"little")
        z.writestr(f"archive/{extra_name}", extra)


def test_importing_record_is_still_run(tmp_path):
    """A short record that is not named like a pickle is skipped only when it cannot import."""
    bad, good = tmp_path / "bad.pt", tmp_path / "good.pt"
    _torch_like_zip(bad, "extra", EVIL_P0)
    _torch_like_zip(good, "extra", b"little endian\n")
    hits = [f for f in scan_paths(bad).findings if f.rule == "pickle.dangerous-global"]
    assert [(f.severity, f.member, f.trigger) for f in hits] == [
        (Severity.CRITICAL, "archive/extra", "os.system")]
    assert scan_paths(good).findings == []


def test_broken_zip_fails_in_both_views(tmp_path):
    """The archive is read once for the parser and the byte-level pass: a central directory that
    cannot be read still leaves the file unparseable, never clean."""
    p = tmp_path / "cut.pt"
    _torch_like_zip(p, "extra", b"x")
    data = p.read_bytes()
    cd = data.rfind(b"PK\x01\x02")
    p.write_bytes(data[:cd] + b"XXXX" + data[cd + 4:])
    report = scan_paths(p)
    assert report.errors == 1
    unparseable = [f for f in report.findings if f.rule == "file.unparseable"]
    assert len(unparseable) == 1 and unparseable[0].severity == Severity.HIGH
    assert "zip:" in unparseable[0].message and "parser:" in unparseable[0].message


def test_classify_memo_is_transparent_and_bounded(monkeypatch):
    monkeypatch.setattr(policy, "_VERDICTS", {})
    monkeypatch.setattr(policy, "_VERDICTS_MAX", 4)
    first = policy.classify("posix", "system")
    assert first is policy.classify("posix", "system")          # memoised
    assert first == policy._classify("posix", "system")          # same verdict as computed
    assert first.category == policy.DENIED and first.dotted == "posix.system"
    for i in range(10):
        policy.classify("pkg", f"name{i}")
    assert len(policy._VERDICTS) <= 4
    # non-str names (never from our VM) are judged uncached
    assert policy.classify(b"os", "getcwd").category == policy.UNKNOWN


def test_call_facts_memo_is_bounded(monkeypatch):
    monkeypatch.setattr(pickles, "_FACTS", {})
    assert pickles._call_facts("copy_reg", "_reconstructor")[0] is True
    assert pickles._call_facts("_pickle", "loads")[1] is True
    assert pickles._call_facts("torch._utils", "_rebuild_tensor_v2") == (
        False, False, "torch._utils._rebuild_tensor_v2")
    for i in range(5000):
        pickles._call_facts("m", f"n{i}")
    assert len(pickles._FACTS) <= 4096


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_walk_real_paths_scan_each_file_once(tmp_path):
    """Real paths come from the walk (folder real path + name): a file reached through a link
    inside the tree and through its own name is scanned once, and the link target is found."""
    top = tmp_path / "top"
    (top / "sub").mkdir(parents=True)
    _torch_like_zip(top / "sub" / "m.pt", "extra", EVIL_P0)
    os.symlink(top / "sub", top / "alias")          # a folder link inside the tree
    os.symlink(top / "sub" / "m.pt", top / "z.pt")  # a file link inside the tree
    walked = list(walk._walk(str(top), True, True, []))
    assert all(real == os.path.realpath(path) for path, real in walked)
    report = scan_paths(top)
    assert len(report.files) == 1
    assert sum(f.rule == "pickle.dangerous-global" for f in report.findings) == 1
