"""The package installs both ways, maps parsers/ and tui/ under tensorscope, and needs no torch."""
from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(out), str(REPO)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    wheels = list(out.glob("tensorscope-*.whl"))
    assert len(wheels) == 1
    return wheels[0]


def test_wheel_maps_parsers_and_tui_under_tensorscope(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "tensorscope/parsers/pickle_vm.py" in names
    assert "tensorscope/parsers/torch_zip.py" in names
    assert "tensorscope/tui/__init__.py" in names
    assert not any(n.startswith(("parsers/", "tui/")) for n in names), "top-level modules leak"


def test_installed_wheel_imports_and_runs(wheel, tmp_path):
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                        str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    code = ("import sys; sys.modules['torch'] = None; sys.modules['safetensors'] = None\n"
            "import tensorscope, tensorscope.parsers.pickle_vm, tensorscope.parsers.torch_zip\n"
            "assert tensorscope.__file__.startswith(sys.argv[1]), tensorscope.__file__\n"
            "m = tensorscope.open(sys.argv[2]); print(len(m.tensors))")
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([sys.executable, "-c", code, str(target), str(REPO / "fixtures/torch/tied.bin")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "2"


def test_every_module_imports_without_torch():
    """torch blocked in sys.modules: every package module still imports."""
    import tensorscope
    names = [m.name for m in pkgutil.walk_packages(tensorscope.__path__, "tensorscope.")
             if m.name != "tensorscope.__main__"]  # importing __main__ runs the CLI
    import tensorscope.parsers
    names += [m.name for m in pkgutil.walk_packages(tensorscope.parsers.__path__, "tensorscope.parsers.")]
    code = ("import sys, importlib; sys.modules['torch'] = None; sys.modules['safetensors'] = None\n"
            "for n in sys.argv[1:]: importlib.import_module(n)")
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_console_script_installed():
    exe = Path(sys.executable).with_name("tensorscope")
    r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("tensorscope ")
