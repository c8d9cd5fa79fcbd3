"""Remote sources against real servers on 127.0.0.1: listings equal the local ones, listing
fetches headers not tensors, and a misbehaving server is a clear error or a documented fallback."""
from __future__ import annotations

import json
import os
import shutil
import socket

import numpy as np
import pytest

import tensorscope
from tensorscope import remote
from tensorscope.cli import main
from tensorscope.remote import FetchBudgetExceeded, RemoteChanged, RemoteError, RemoteSource
from tensorscope.scanning import scan_paths

from http_server import Server

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures")

FILES = [
    "torch/module.pt", "torch/dtypes.pt", "torch/align4096.pt", "torch/views.pt", "torch/quantized.pt",
    "formats/st_torch.safetensors", "formats/st_subbyte.safetensors",
    "onnx/mlp.onnx", "onnx/typed.onnx", "onnx/nested.onnx", "onnx/external_one/model.onnx",
    "onnx/external_many/model.onnx",
    "formats/gguf_v3.gguf", "formats/gguf_be.gguf", "formats/gguf_alltypes.gguf",
    "formats/f32.npy", "formats/bigendian.npy", "formats/plain.npz",
    "containers/legacy_module.pt", "containers/ts_traced.pt", "containers/plain_numpy_p4.pkl",
    "realworld/hf/llama/sharded_st/model.safetensors.index.json",
    "realworld/hf/gpt2/sharded_bin/pytorch_model.bin.index.json",
]


def _listing(model):
    return [(t.name, t.dtype, t.shape, t.stride, t.storage_offset, t.byte_offset, t.nbytes,
             os.path.basename(t.file or "")) for t in model.tensors]


@pytest.fixture(scope="module")
def fixtures_server():
    with Server(FIX) as s:
        yield s


@pytest.fixture(autouse=True)
def _fresh_counters():
    remote.reset_totals()


@pytest.mark.parametrize("rel", FILES)
def test_listing_over_http_equals_local(fixtures_server, rel):
    local = os.path.join(FIX, rel)
    with tensorscope.open(local) as a, tensorscope.open(fixtures_server.url(rel)) as b:
        assert b.format == a.format
        assert _listing(b) == _listing(a)
        assert [(x.kind, x.offset) for x in b.evidence.anomalies] == \
            [(x.kind, x.offset) for x in a.evidence.anomalies]
        for t in a.tensors:
            try:
                want = a.values(t.name)
            except tensorscope.TensorscopeError as e:
                with pytest.raises(type(e)):
                    b.values(t.name)
                continue
            got = b.values(t.name)
            assert got.dtype == want.dtype and got.shape == want.shape
            if want.dtype == object:
                assert got.tolist() == want.tolist()
            else:
                assert got.tobytes() == want.tobytes()  # bit for bit, NaN payloads included
    assert remote.totals()["objects"] >= 1


# -- fetching headers, not tensors ------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_models(tmp_path_factory):
    """~8 MB models written by the real libraries, a few tensors each."""
    import onnx
    import torch
    from onnx import helper, numpy_helper
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("big")
    g = torch.Generator().manual_seed(0)
    tensors = {f"layers.{i}.weight": torch.randn(512, 1024, generator=g) for i in range(4)}
    tensors["norm.bias"] = torch.randn(1024, generator=g)
    torch.save(tensors, d / "model.pt")
    save_file(tensors, str(d / "model.safetensors"))
    inits = [numpy_helper.from_array(v.numpy(), k) for k, v in tensors.items()]
    graph = helper.make_graph([helper.make_node("Identity", ["norm.bias"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1024])],
                              initializer=inits)
    onnx.save(helper.make_model(graph), str(d / "model.onnx"))
    import gguf
    w = gguf.GGUFWriter(str(d / "model.gguf"), "llama")
    w.add_block_count(4)
    for k, v in tensors.items():
        w.add_tensor(k, v.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return d, tensors


@pytest.mark.parametrize("name", ["model.pt", "model.safetensors", "model.onnx", "model.gguf"])
def test_listing_fetches_the_headers_not_the_tensors(big_models, name):
    d, tensors = big_models
    with Server(d) as s:
        with tensorscope.open(d / name) as a, tensorscope.open(s.url(name)) as b:
            assert _listing(b) == _listing(a)
            size = os.path.getsize(d / name)
            listed = remote.totals()
            assert listed["bytes"] < 0.05 * size, (listed, size)
            assert s.knobs.bytes_sent == listed["bytes"]
            # values come only when asked, and are the library's values
            got = b.read("layers.2.weight")
            assert np.array_equal(got, tensors["layers.2.weight"].numpy())
            assert remote.totals()["bytes"] - listed["bytes"] <= 512 * 1024 * 4 + 64 * 1024


def test_zip_local_headers_are_fetched_together(big_models):
    d, _ = big_models
    with Server(d) as s:
        with tensorscope.open(s.url("model.pt")):
            pass
        # head + tail (EOCD, central directory) + one coalesced batch, not one request per member
        assert s.knobs.requests <= 6, s.knobs.requests


@pytest.fixture(scope="module")
def many_initializers(tmp_path_factory):
    """ONNX models of 121 initializers written by onnx: 24 layers of 5 tensors (two of them the
    same size, as attention projections are), and the same count with sizes of no pattern."""
    import onnx
    from onnx import helper, numpy_helper

    d = tmp_path_factory.mktemp("initializers")
    rng = np.random.default_rng(0)
    shapes = [(256, 256), (256, 512), (512, 256), (512,), (128, 300)]
    layered = [(f"model.layers.{i}.t{k}.weight", shape) for i in range(24)
               for k, shape in enumerate(shapes)] + [("norm.weight", (512,))]
    noise = [(f"w{i}", (int(rng.integers(100, 400)), 257)) for i in range(121)]
    for name, tensors in (("layers.onnx", layered), ("noise.onnx", noise)):
        inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float16), n)
                 for n, shape in tensors]
        graph = helper.make_graph([helper.make_node("Identity", [tensors[0][0]], ["y"])], "g", [],
                                  [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT16,
                                                                 list(tensors[0][1]))],
                                  initializer=inits)
        onnx.save(helper.make_model(graph), str(d / name))
    return d


@pytest.mark.parametrize("name", ["layers.onnx", "noise.onnx"])
def test_onnx_walk_asks_for_the_tensors_to_come_in_batches(many_initializers, name):
    """The walk hops from initializer to initializer over their raw data: the starts it will
    need are guessed and fetched together (few waits on the network for a repeating model), the
    listing is the local one whatever the guesses, and no tensor's data is fetched."""
    d = many_initializers
    with Server(d) as s:
        with tensorscope.open(d / name) as a, tensorscope.open(s.url(name)) as b:
            assert _listing(b) == _listing(a)
            src = b.sources[s.url(name)]
            assert src.requests == s.knobs.requests
            big = [t for t in b.tensors if t.nbytes > 64 * 1024]
            assert len(big) > 70
            assert not any(src.cached(t.byte_offset + 4096, t.nbytes - 8192) for t in big)
            assert src.bytes_fetched < 0.1 * os.path.getsize(d / name)
            if name == "layers.onnx":
                # one wait per tensor without the guesses
                assert src.waits <= len(b.tensors) // 5, src.waits


def test_onnx_external_data_costs_its_size_only(big_models, tmp_path):
    """Listing an ONNX model over HTTP asks its external data file for its size (one byte), not
    for a head of it."""
    import onnx
    d, _ = big_models
    m = onnx.load(str(d / "model.onnx"))
    onnx.save(m, str(tmp_path / "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    with Server(tmp_path) as s:
        with tensorscope.open(tmp_path / "model.onnx") as a, \
                tensorscope.open(s.url("model.onnx")) as b:
            assert _listing(b) == _listing(a)
    assert remote.totals()["objects"] == 2
    assert remote.totals()["bytes"] == os.path.getsize(tmp_path / "model.onnx") + 1


def test_scan_of_a_url_opens_it_once(big_models):
    d, _ = big_models
    with Server(d) as s:
        for name in ("model.safetensors", "model.onnx", "model.gguf"):
            remote.reset_totals()
            with tensorscope.open(s.url(name)):
                pass
            listed = remote.totals()
            remote.reset_totals()
            scan_paths(s.url(name))
            scanned = remote.totals()
            assert scanned["objects"] == 1, (name, scanned)
            assert scanned["requests"] <= listed["requests"] + 1, (name, listed, scanned)


# -- misbehaving servers ------------------------------------------------------------------------------
def test_server_that_ignores_range_is_read_whole_within_the_budget(fixtures_server):
    rel = "formats/st_torch.safetensors"
    fixtures_server.knobs.ignore_range = True
    try:
        with tensorscope.open(fixtures_server.url(rel)) as b, tensorscope.open(os.path.join(FIX, rel)) as a:
            assert _listing(b) == _listing(a)
            src = b.sources[b.path]
            assert not src.ranges_ok and src.bytes_fetched == src.size and src.requests == 1
    finally:
        fixtures_server.knobs.ignore_range = False


def test_server_that_ignores_range_past_the_budget_is_refused(big_models, monkeypatch):
    d, _ = big_models
    monkeypatch.setenv("TENSORSCOPE_FETCH_BUDGET", "1M")
    with Server(d) as s:
        s.knobs.ignore_range = True
        with pytest.raises(FetchBudgetExceeded, match="ignores HTTP Range") as e:
            tensorscope.open(s.url("model.safetensors"))
        assert s.url("model.safetensors") in str(e.value)
        assert remote.totals()["bytes"] == 0


def test_budget_refuses_a_read_before_making_it(big_models, monkeypatch):
    d, _ = big_models
    monkeypatch.setenv("TENSORSCOPE_FETCH_BUDGET", "256K")
    with Server(d) as s:
        with tensorscope.open(s.url("model.safetensors")) as m:
            before = s.knobs.bytes_sent
            with pytest.raises(FetchBudgetExceeded, match="TENSORSCOPE_FETCH_BUDGET"):
                m.read("layers.0.weight")
            assert s.knobs.bytes_sent == before


def test_416_is_a_clear_error(fixtures_server):
    fixtures_server.knobs.always_416 = True
    try:
        with pytest.raises(RemoteError, match="416"):
            tensorscope.open(fixtures_server.url("torch/module.pt"))
    finally:
        fixtures_server.knobs.always_416 = False


def test_redirects_are_followed(fixtures_server):
    rel = "torch/dtypes.pt"
    with tensorscope.open(fixtures_server.url("r/" + rel)) as b, tensorscope.open(os.path.join(FIX, rel)) as a:
        assert _listing(b) == _listing(a)


def test_response_cut_short_is_retried_then_an_error(big_models, monkeypatch):
    d, _ = big_models
    monkeypatch.setattr(remote, "BACKOFF", 0.01)
    with Server(d) as s:
        with tensorscope.open(s.url("model.safetensors")) as m:
            s.knobs.cut_short = True
            with pytest.raises(RemoteError, match=r"cut short.*gave up after 4 attempts"):
                m.read("layers.1.weight")


def test_object_changed_mid_read_is_an_error(big_models):
    d, _ = big_models
    with Server(d) as s:
        with tensorscope.open(s.url("model.safetensors")) as m:
            s.knobs.change_after = s.knobs.requests
            with pytest.raises(RemoteChanged, match="ETag"):
                m.read("layers.3.weight")


def test_object_changed_between_listing_requests_is_an_error(big_models):
    d, _ = big_models
    with Server(d) as s:
        s.knobs.change_after = 1  # after the first request (head) the object is another one
        with pytest.raises(RemoteChanged):
            tensorscope.open(s.url("model.pt"))


def test_missing_object_is_an_error_exit_2(fixtures_server, capsys):
    assert main(["inspect", fixtures_server.url("nope.pt")]) == 2
    err = capsys.readouterr().err
    assert "404" in err and "Traceback" not in err


# -- the CLI -----------------------------------------------------------------------------------------
def test_inspect_json_and_verbose_say_what_it_cost(fixtures_server, capsys):
    rel = "torch/module.pt"
    assert main(["inspect", os.path.join(FIX, rel), "--json"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert "fetched" not in local
    remote.reset_totals()
    assert main(["inspect", fixtures_server.url(rel), "--json", "-v"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["fetched"]["bytes"] == os.path.getsize(os.path.join(FIX, rel))
    assert doc["fetched"]["requests"] >= 1 and doc["fetched"]["objects"] == 1
    assert [t["name"] for t in doc["tensors"]] == [t["name"] for t in local["tensors"]]
    n = doc["fetched"]["requests"]
    assert f"fetched {doc['fetched']['bytes']} bytes in {n} request{'s' if n != 1 else ''}" in out.err


def test_diff_and_convert_take_urls(fixtures_server, tmp_path, capsys):
    url = fixtures_server.url("diff/base.pt")
    assert main(["diff", url, os.path.join(FIX, "diff/base.pt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fetched"]["objects"] == 1
    out = tmp_path / "m.safetensors"
    assert main(["convert", url, str(out)]) == 0
    with tensorscope.open(out) as a, tensorscope.open(os.path.join(FIX, "diff/base.pt")) as b:
        assert sorted(a.names) == sorted(b.names)
        for t in b.tensors:
            assert np.array_equal(a.read(t.name), b.read(t.name))


def _verdicts(report, base):
    return [(f.severity, f.rule, f.member, f.offset, f.trigger, f.message.replace(base, "<here>"))
            for f in report.findings]


def test_scan_over_http_gives_the_local_verdicts(attack_corpus):
    root, cases = attack_corpus
    with Server(root) as s:
        for case in cases:
            rel = os.path.relpath(case.path, root)
            if os.path.isdir(case.path):
                continue
            local = scan_paths(case.path)
            far = scan_paths(s.url(rel))
            assert _verdicts(far, s.url(rel)) == _verdicts(local, str(case.path)), rel
            assert far.exit_code(1) == local.exit_code(1)


# -- s3:// through a real local S3 server (moto) -----------------------------------------------------
def _free_port() -> int:
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


@pytest.fixture
def s3_server(monkeypatch):
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(k, v)
    import fsspec
    monkeypatch.setitem(fsspec.config.conf, "s3", {"client_kwargs": {"endpoint_url": endpoint}})
    import s3fs
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
    finally:
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()


def test_s3_listing_equals_local_and_change_is_detected(s3_server, big_models):
    d, tensors = big_models
    fs = s3_server
    fs.mkdir("models")
    for name in ("model.safetensors", "model.pt"):
        fs.put(str(d / name), f"models/{name}")
        with tensorscope.open(d / name) as a, tensorscope.open(f"s3://models/{name}") as b:
            assert _listing(b) == _listing(a)
            assert remote.totals()["bytes"] < 0.05 * os.path.getsize(d / name)
            assert np.array_equal(b.read("norm.bias"), tensors["norm.bias"].numpy())
    with tensorscope.open("s3://models/model.safetensors") as b:
        fs.pipe("models/model.safetensors", b"replaced")
        with pytest.raises(RemoteChanged):
            b.read("layers.0.weight")
    # a folder: the model it holds (here the one safetensors file left beside a .pt)
    fs.rm("models/model.pt")
    fs.put(str(d / "model.safetensors"), "models/model.safetensors")
    with tensorscope.open("s3://models") as m:
        assert sorted(m.names) == sorted(tensors)


# -- hf:// through huggingface_hub against a local hub server -----------------------------------------
@pytest.fixture
def hub(monkeypatch, tmp_path):
    """`HubServer` with ``org/llama`` (a sharded safetensors folder) and ``org/mixed`` (a torch
    zip, a safetensors file, an ONNX model and a pickle payload); the real HfFileSystem pointed
    at it the way fsspec configures it (`HF_ENDPOINT` is tested in a child process below)."""
    pytest.importorskip("huggingface_hub")
    import fsspec
    from huggingface_hub import HfFileSystem

    import make_attack_corpus
    from http_server import HubServer

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for rel in ("torch/dtypes.pt", "formats/st_torch.safetensors", "onnx/mlp.onnx"):
        shutil.copy(os.path.join(FIX, rel), mixed / os.path.basename(rel))
    (mixed / "evil.bin").write_bytes(make_attack_corpus.torch_zip_with_payload(
        make_attack_corpus.payload("os", "system", 2, "global-reduce")))
    with HubServer() as server:
        server.commit("org/llama", os.path.join(FIX, "realworld/hf/llama/sharded_st"))
        server.commit("org/mixed", mixed)
        monkeypatch.setitem(fsspec.config.conf, "hf", {"endpoint": server.endpoint})
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        HfFileSystem.clear_instance_cache()
        try:
            yield server, mixed
        finally:
            HfFileSystem.clear_instance_cache()


def test_hf_listing_equals_local(hub):
    server, mixed = hub
    for name in ("dtypes.pt", "st_torch.safetensors", "mlp.onnx"):
        with tensorscope.open(mixed / name) as a, tensorscope.open(f"hf://org/mixed/{name}") as b:
            assert _listing(b) == _listing(a)
            for t in a.tensors[:3]:
                assert b.values(t.name).tobytes() == a.values(t.name).tobytes()
    # a repository is a folder: the index and its shards, as the local snapshot opens
    local = os.path.join(FIX, "realworld/hf/llama/sharded_st")
    with tensorscope.open(local) as a, tensorscope.open("hf://org/llama") as b:
        assert b.format == a.format and _listing(b) == _listing(a)
    assert remote.totals()["objects"] >= 4 and server.knobs.requests > 0


def test_hf_reads_stay_on_the_commit_opened(hub, big_models, tmp_path):
    """A branch that moves while a model is open does not mix two versions: the values are read
    from the commit the branch pointed at when the file was opened."""
    server, _ = hub
    d, tensors = big_models
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    data = (d / "model.safetensors").read_bytes()
    start = 8 + int.from_bytes(data[:8], "little")   # every tensor byte changes, the header not
    (old / "model.safetensors").write_bytes(data)
    (new / "model.safetensors").write_bytes(data[:start] + bytes(b ^ 0xFF for b in data[start:]))
    server.commit("org/pinned", old)
    with tensorscope.open("hf://org/pinned/model.safetensors") as b:
        server.commit("org/pinned", new)   # main moves on before any value is read
        for name, t in tensors.items():
            assert np.array_equal(b.read(name), t.numpy()), name
    with tensorscope.open("hf://org/pinned/model.safetensors") as b:   # opened again: new
        assert not np.array_equal(b.read("layers.3.weight"), tensors["layers.3.weight"].numpy())


def test_hf_scan_gives_the_local_verdicts(hub):
    server, mixed = hub
    for name in ("dtypes.pt", "st_torch.safetensors", "mlp.onnx", "evil.bin"):
        local, far = scan_paths(mixed / name), scan_paths(f"hf://org/mixed/{name}")
        assert _verdicts(far, f"hf://org/mixed/{name}") == _verdicts(local, str(mixed / name))
        assert far.exit_code(1) == local.exit_code(1)
    assert scan_paths("hf://org/mixed").unsafe


def test_hf_missing_repo_revision_or_file_is_exit_2(hub, capsys):
    for url in ("hf://org/nothere/model.safetensors", "hf://org/mixed@v9/dtypes.pt",
                "hf://org/mixed/nothere.safetensors"):
        assert main(["inspect", url]) == 2
        err = capsys.readouterr().err
        assert url.split("://")[1].split("/")[1].split("@")[0] in err and "Traceback" not in err


def test_hf_endpoint_variable_points_the_cli_at_the_server(hub):
    """The real set-up: `HF_ENDPOINT` in the environment of a fresh process."""
    import subprocess
    import sys
    server, mixed = hub
    env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1"}
    out = subprocess.run([sys.executable, "-m", "tensorscope", "inspect", "hf://org/llama",
                          "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    with tensorscope.open(os.path.join(FIX, "realworld/hf/llama/sharded_st")) as a:
        assert [t["name"] for t in doc["tensors"]] == [t.name for t in a.tensors]
    assert doc["fetched"]["objects"] >= 3


def test_tui_browses_a_url(fixtures_server):
    import asyncio

    from tensorscope.tui.app import make_app
    from tensorscope.tui.screens.browse import BrowseScreen

    from helpers import settle

    rel = "tui/model_a.safetensors"
    app = make_app(fixtures_server.url(rel))

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert isinstance(app.screen, BrowseScreen)
            with tensorscope.open(os.path.join(FIX, rel)) as local:
                assert [t.name for t in app.models[0].tensors] == local.names
            assert app.scan_done and not app.scan_error
    asyncio.run(go())


def _open_outcome(path: str, shown: str):
    try:
        with tensorscope.open(path) as m:
            return "ok", m.format, _listing(m)
    except (tensorscope.TensorscopeError, OSError) as e:
        return "error", type(e).__name__, str(e).replace(shown, "<file>")


def test_hostile_files_fail_over_http_as_they_fail_locally(attack_corpus):
    """The attack corpus (broken zips, lying headers, truncations...): the same listing or the
    same error, place and reason, whether read from disk or by ranges."""
    root, cases = attack_corpus
    with Server(root) as s:
        for case in cases:
            if os.path.isdir(case.path):
                continue
            rel = os.path.relpath(case.path, root)
            local = _open_outcome(str(case.path), str(case.path))
            far = _open_outcome(s.url(rel), s.url(rel))
            assert far == local, rel


@pytest.mark.parametrize("rel", ["torch/module.pt", "formats/st_torch.safetensors", "onnx/mlp.onnx",
                                 "formats/gguf_v3.gguf"])
def test_identify_over_http_equals_local(fixtures_server, rel):
    assert tensorscope.identify(fixtures_server.url(rel)) == tensorscope.identify(os.path.join(FIX, rel))


def test_a_lying_size_is_a_clear_error(fixtures_server):
    """A Content-Range total of 2**60 bytes: an error naming the URL, no cache of that size."""
    fixtures_server.knobs.claimed_size = 1 << 60
    try:
        with pytest.raises(RemoteError, match=r"the server sent 'bytes 0-4990/1152921504606846976'"):
            tensorscope.open(fixtures_server.url("torch/module.pt"))
    finally:
        fixtures_server.knobs.claimed_size = None


def test_big_objects_get_bigger_blocks(big_models, monkeypatch):
    """The block map is bounded (here forced to 16 blocks): reads still equal the local ones."""
    d, tensors = big_models
    monkeypatch.setattr(remote, "MAX_BLOCKS", 16)
    with Server(d) as s:
        with tensorscope.open(s.url("model.safetensors")) as b, \
                tensorscope.open(d / "model.safetensors") as a:
            src = b.sources[b.path]
            assert src._shift > remote.BLOCK_SHIFT and len(src._have) <= 17
            assert _listing(b) == _listing(a)
            for t in a.tensors:
                assert b.read(t.name).tobytes() == a.read(t.name).tobytes()
