"""Whole-process peak memory of listing a 2 GB, 500-tensor torch zip (`perf`: machine-dependent).

The zip is a real ``torch.save`` (under ``skip_data``: every record written, the storage bytes
left as holes, so it costs no disk); listing it must read its central directory, local headers
and pickle only: the peak RSS of the whole process stays at or under 40 MiB (the interpreter and
the imports are ~17 MiB of it). Measured from a small launcher so that the figure is the child's
own (a forked pytest would lend it its pages).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

LAUNCH = ("import resource, subprocess, sys\n"
          "p = subprocess.run([sys.executable, '-m', 'tensorscope', 'inspect', '--json', sys.argv[1]],"
          " stdout=subprocess.PIPE)\n"
          "sys.stdout.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) + ' ' +"
          " str(p.returncode) + '\\n')\n"
          "sys.stdout.write(p.stdout.decode())\n")


@pytest.fixture(scope="module")
def sparse_zip(tmp_path_factory):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.serialization import skip_data
    with FakeTensorMode():
        sd = {f"layer.{i}.weight": torch.empty(1024, 2048, dtype=torch.float16) for i in range(500)}
    path = tmp_path_factory.mktemp("listing") / "model.pt"
    with skip_data(materialize_fake_tensors=True):
        torch.save(sd, path)
    yield path
    path.unlink()


@pytest.mark.perf
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss of a child, Linux")
def test_listing_a_2gb_torch_zip_peaks_under_40mib(sparse_zip):
    assert sparse_zip.stat().st_size > 2 * 10**9
    out = subprocess.run([sys.executable, "-S", "-c", LAUNCH, str(sparse_zip)], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    head, body = out.stdout.split("\n", 1)
    peak_kib, rc = map(int, head.split())
    assert rc == 0
    assert json.loads(body)["summary"]["tensors"] == 500
    assert peak_kib / 1024 <= 40, f"peak RSS {peak_kib / 1024:.1f} MiB listing a 2 GB torch zip"
