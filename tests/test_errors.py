"""Errors a new user meets first: a missing or unreadable path, and one error style in every command."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import tensorscope
from tensorscope import cli
from tensorscope.errors import AccessDenied, FileAccessError, FileMissing, TensorscopeError
from tensorscope.safetext import is_clean

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MODEL = FIXTURES / "diff" / "base.safetensors"


def test_missing_file_is_a_tensorscope_error_and_a_file_not_found(tmp_path):
    path = tmp_path / "nonexistent.pt"
    with pytest.raises(TensorscopeError) as info:
        tensorscope.open(path)
    err = info.value
    assert isinstance(err, FileMissing) and isinstance(err, FileNotFoundError)
    assert str(err) == f"{path}: no such file or directory"
    with pytest.raises(FileMissing):
        tensorscope.identify(path)


def test_unreadable_file_through_a_mocked_open(tmp_path, monkeypatch):
    """As root permission bits do not bind: the OS refusal is simulated where it would happen."""
    path = tmp_path / "model.safetensors"
    shutil.copyfile(MODEL, path)
    real_open = open

    def refusing(file, *a, **kw):
        if os.fspath(file) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(file, *a, **kw)
    monkeypatch.setattr("builtins.open", refusing)
    with pytest.raises(AccessDenied) as info:
        tensorscope.open(path)
    assert isinstance(info.value, PermissionError) and isinstance(info.value, TensorscopeError)
    assert str(info.value) == f"{path}: permission denied"


def test_unlistable_folder_through_a_mocked_listdir(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    shutil.copyfile(MODEL, folder / "model.safetensors")

    def refusing(p="."):
        raise PermissionError(13, "Permission denied", os.fspath(p))
    monkeypatch.setattr(os, "listdir", refusing)
    monkeypatch.setattr(os, "scandir", refusing)
    with pytest.raises(AccessDenied, match="permission denied"):
        tensorscope.open(folder)


def _as_nobody() -> list[str] | None:
    """A command prefix that drops root to `nobody` (setpriv), or None when that is not possible."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"] if setpriv else None


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_permission_denied_for_real(kind):
    """The real refusal: mode 000, read by an unprivileged user (root drops to nobody)."""
    prefix = _as_nobody()
    if prefix is None:
        pytest.skip("running as root without setpriv: permission bits do not bind")
    top = tempfile.mkdtemp(prefix="ts-perm-")
    try:
        os.chmod(top, 0o755)  # nobody may reach the path, not read it
        target = os.path.join(top, "model.safetensors" if kind == "file" else "ckpt")
        if kind == "file":
            shutil.copyfile(MODEL, target)
        else:
            os.mkdir(target)
            shutil.copyfile(MODEL, os.path.join(target, "model.safetensors"))
        os.chmod(target, 0)
        code = "import sys, tensorscope.cli as c; sys.exit(c.main(sys.argv[1:]))"
        done = subprocess.run(prefix + [sys.executable, "-c", code, "inspect", target],
                              capture_output=True, text=True, timeout=120)
        if prefix and "ModuleNotFoundError" in done.stderr:
            pytest.skip("the unprivileged user cannot read this checkout")
        assert done.returncode == 2, done.stderr
        assert done.stderr == f"tensorscope inspect: error: {target}: permission denied\n"
    finally:
        os.chmod(os.path.join(top, "model.safetensors" if kind == "file" else "ckpt"), 0o755)
        shutil.rmtree(top)


# -- one error style ------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["inspect", "{missing}"],
    ["diff", "{missing}", str(MODEL)],
    ["scan", "{missing}"],
    ["convert", "{missing}", "{out}"],
])
def test_missing_path_one_style_in_every_command(argv, tmp_path, capsys):
    missing = tmp_path / "missing.pt"
    args = [a.format(missing=missing, out=tmp_path / "out.safetensors") for a in argv]
    assert cli.main(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"tensorscope {argv[0]}: error: {missing}: no such file or directory\n"


def test_error_text_from_a_file_is_escaped(tmp_path, capsys):
    """A hostile file name reaches the error line escaped, never raw."""
    path = tmp_path / "evil\x1b]0;pwned\x07.pt"
    path.write_bytes(b"\x00garbage that no parser recognises")
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tensorscope inspect: error: ") and err.count("\n") == 1
    assert is_clean(err) and "\\x1b]0;pwned\\x07" in err


def test_file_access_error_is_an_os_error():
    err = FileAccessError("/x", "is a directory", 21)
    assert isinstance(err, OSError) and err.errno == 21 and str(err) == "/x: is a directory"
