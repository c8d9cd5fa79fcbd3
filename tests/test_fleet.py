"""Fleets: --jobs processes, a Dask LocalCluster, JSON lines and --resume give the verdicts of a
sequential scan, file by file."""
from __future__ import annotations

import json
import os
import shutil

import pytest

import make_attack_corpus
from tensorscope import remote
from tensorscope.cli import main
from tensorscope.scanning import fleet, plan, scan_paths

from http_server import Server

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures")


@pytest.fixture(scope="module")
def registry(tmp_path_factory, attack_corpus):
    """A folder of model files: the attack corpus (findings of every kind) and clean fixtures."""
    root = tmp_path_factory.mktemp("registry")
    shutil.copytree(attack_corpus.root, root / "attacks", symlinks=True)
    for sub in ("torch", "onnx", "formats"):
        shutil.copytree(os.path.join(FIX, sub), root / sub)
    return root


def _doc(report):
    return report.to_dict()


@pytest.fixture(scope="module")
def sequential(registry):
    return _doc(scan_paths(registry))


def test_jobs_give_the_sequential_verdicts(registry, sequential, tmp_path):
    out = tmp_path / "r.jsonl"
    report = fleet.scan_fleet([registry], jobs=2, jsonl=str(out))
    assert _doc(report) == sequential
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    order, _ = plan(registry)
    assert sorted(r["path"] for r in lines) == sorted(p for p, _ in order)
    by_file = {}
    for f in sequential["findings"]:
        by_file.setdefault(f["file"], []).append(f)
    for rec in lines:
        assert rec["size"] == os.path.getsize(rec["path"]) and rec["mtime_ns"]
        mine = by_file.get(rec["path"], [])
        worst = max((f["severity"] for f in mine), key=["info", "low", "medium", "high",
                                                          "critical"].index, default=None)
        assert rec["severity"] == worst, rec["path"]
        assert sorted(json.dumps(f, sort_keys=True) for f in rec["findings"]) == \
            sorted(json.dumps(f, sort_keys=True) for f in mine)


def test_jobs_from_a_process_with_threads(registry, sequential, monkeypatch):
    """With another thread alive fork is unsafe: the workers come from a forkserver (that
    preloads the parsers) and still give the sequential verdicts."""
    import multiprocessing
    import threading
    methods = []
    real = multiprocessing.get_context
    monkeypatch.setattr(multiprocessing, "get_context",
                        lambda method=None: methods.append(method) or real(method))
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        report = fleet.scan_fleet([registry], jobs=2)
    finally:
        stop.set()
        other.join()
    assert methods == ["forkserver"]
    assert _doc(report) == sequential


def test_resume_rescans_only_what_changed(registry, sequential, tmp_path):
    work = tmp_path / "reg"
    shutil.copytree(registry, work)
    out = str(tmp_path / "r.jsonl")
    first = fleet.scan_fleet([work], jsonl=out)
    seen = []
    again = fleet.scan_fleet([work], jsonl=out, resume=out, on_record=seen.append)
    assert seen == [] and _doc(again) == _doc(first)
    victim = work / "torch" / "module.pt"
    evil = make_attack_corpus.torch_zip_with_payload(
        make_attack_corpus.payload("os", "system", 2, "global-reduce"))
    victim.write_bytes(evil)
    third = fleet.scan_fleet([work], jsonl=out, resume=out, on_record=seen.append)
    assert [r["path"] for r in seen] == [str(victim)]
    assert _doc(third) == _doc(scan_paths(work))
    assert any(f.file == str(victim) and f.rule == "pickle.dangerous-global" for f in third.findings)


def test_dask_local_cluster_gives_the_sequential_verdicts(registry, sequential):
    pytest.importorskip("distributed")
    report = fleet.scan_fleet([registry / "attacks"], dask="local")
    assert _doc(report) == _doc(scan_paths(registry / "attacks"))


def test_scan_record_is_pure_and_picklable(registry):
    import pickle
    path = str(registry / "torch" / "module.pt")
    fn = pickle.loads(pickle.dumps(fleet.scan_record))
    a, b = fn(path), fleet.scan_record(path)
    for rec in (a, b):
        rec.pop("seconds"), rec.pop("cpu_seconds")
    assert a == b


def test_cli_jobs_json_equals_sequential(registry, capsys):
    assert main(["scan", str(registry / "attacks"), "--json"]) == 1
    want = json.loads(capsys.readouterr().out)
    assert main(["scan", str(registry / "attacks"), "--json", "--jobs", "2"]) == 1
    assert json.loads(capsys.readouterr().out) == want


def test_cli_jsonl_to_stdout(registry, capsys):
    assert main(["scan", str(registry / "formats"), "--jsonl", "-"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["path"] for r in lines} == {str(registry / "formats" / n)
                                          for n in os.listdir(registry / "formats")}


def test_remote_files_on_processes_report_what_workers_fetched(capsys):
    remote.reset_totals()
    with Server(FIX) as s:
        urls = [s.url(r) for r in ("torch/dtypes.pt", "formats/st_torch.safetensors",
                                   "onnx/mlp.onnx")]
        assert main(["scan", *urls, "--jobs", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["files"] == [urls[2], urls[0], urls[1]]  # ONNX first, as scan_paths orders
    assert doc["fetched"]["objects"] >= 3 and doc["fetched"]["bytes"] >= sum(
        os.path.getsize(os.path.join(FIX, r)) for r in ("torch/dtypes.pt",
                                                         "formats/st_torch.safetensors",
                                                         "onnx/mlp.onnx"))


def test_resume_over_http_uses_the_etag(tmp_path):
    names = ["torch/dtypes.pt", "formats/st_torch.safetensors"]
    out = str(tmp_path / "r.jsonl")
    with Server(FIX) as s:
        urls = [s.url(n) for n in names]
        first = fleet.scan_fleet(urls, jsonl=out)
        recs = fleet.load_resume(out)
        for n, u in zip(names, urls):
            assert recs[u]["size"] == os.path.getsize(os.path.join(FIX, n))
            assert recs[u]["version"] and recs[u]["version"].startswith('"')  # the ETag
        seen = []
        again = fleet.scan_fleet(urls, jsonl=out, resume=out, on_record=seen.append)
        assert seen == [] and again.to_dict() == first.to_dict()
        s.knobs.change_after = s.knobs.requests  # a new version of every object
        again = fleet.scan_fleet(urls, jsonl=out, resume=out, on_record=seen.append)
        assert sorted(r["path"] for r in seen) == sorted(urls)


def test_dask_cluster_by_address(registry):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        report = fleet.scan_fleet([registry / "formats"], dask=cluster.scheduler_address)
    assert report.to_dict() == scan_paths(registry / "formats").to_dict()
