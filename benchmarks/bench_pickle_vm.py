"""Benchmark: the symbolic pickle VM against its peers on a real torch ``data.pkl``.

Makes a state dict of N small tensors with torch (in a temp dir), extracts ``archive/data.pkl``
with zipfile, and times, best of R runs:

- ``pickletools.genops``: ``for _ in genops(data): pass`` (decoding only, builds nothing);
- torch's weights_only unpickler, ``torch._weights_only_unpickler.Unpickler(...).load()``, with a
  ``persistent_load`` that returns meta-device storages (so no tensor memory is allocated; the
  rebuild functions still build real tensor objects, as ``torch.load(weights_only=True)`` does);
- the C ``_pickle`` Unpickler with stub ``find_class``/``persistent_load`` (a floor for
  reference; it is allowed here only because the bytes are our own);
- ``pickle_vm.run`` without hooks (every rebuild stays a `Call`), and with `CONTAINER_HOOKS` plus
  a ``_rebuild_tensor_v2`` hook that returns a tuple, as the torch parser does; on bytes and on a
  memoryview.

Times are process CPU time (best of R), so that other load on the machine does not count.
One table per pickle protocol (torch.save's default 2, and 4, which has FRAME/MEMOIZE and
which torch's weights_only unpickler refuses).
Run: ``python benchmarks/bench_pickle_vm.py [--tensors 10000] [--repeat 7] [--protocols 2,4]``.
"""
from __future__ import annotations

import argparse
import collections
import gc
import io
import pickle
import pickletools
import sys
import tempfile
import time
import warnings
import zipfile
from pathlib import Path

import torch
import torch._weights_only_unpickler as wou

from tensorscope.parsers import pickle_vm


def make_data_pkl(n_tensors: int, tmp: Path, protocol: int = 2) -> bytes:
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.int64]
    sd = collections.OrderedDict()
    for i in range(n_tensors):
        sd[f"model.layers.{i // 8}.block.{i % 8}.weight"] = torch.zeros(
            (4, 3) if i % 3 else (5,), dtype=dtypes[i % len(dtypes)])
    path = tmp / "model.pt"
    torch.save(sd, path, pickle_protocol=protocol)
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return z.read(name)


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.process_time()   # CPU time: the machine is shared, wall time is noise
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def torch_weights_only(data: bytes):
    def persistent_load(pid):
        _, storage_type, _key, _location, numel = pid
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        nbytes = numel * torch._utils._element_size(dtype)
        untyped = torch.UntypedStorage(nbytes, device="meta")
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)

    unpickler = wou.Unpickler(io.BytesIO(data))
    unpickler.persistent_load = persistent_load
    return unpickler.load()


class _StubUnpickler(pickle.Unpickler):
    """C unpickler over our own bytes, with every global replaced by a tuple-builder."""

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        return lambda *args: (module, name, args)

    def persistent_load(self, pid):
        return pid


def c_pickle(data: bytes):
    return _StubUnpickler(io.BytesIO(data)).load()


def genops(data: bytes):
    for _ in pickletools.genops(data):
        pass


def rebuild_hook(args, pos):
    return ("tensor", args[1], args[2], args[3])


TORCH_HOOKS = {**pickle_vm.CONTAINER_HOOKS, ("torch._utils", "_rebuild_tensor_v2"): rebuild_hook}


def bench(data: bytes, n_tensors: int, repeat: int) -> list[tuple[str, float | None]]:
    check = pickle_vm.run(data, hooks=TORCH_HOOKS, persistent_load=lambda pid, pos: pid)
    check.raise_for_error()
    assert len(check.value) == n_tensors, "VM value does not hold every tensor"
    view = memoryview(data)
    cases = [
        ("pickle_vm.run (no hooks: Calls)", lambda: pickle_vm.run(data)),
        ("pickle_vm.run (torch hooks + persistent_load)",
         lambda: pickle_vm.run(data, hooks=TORCH_HOOKS, persistent_load=lambda pid, pos: pid)),
        ("pickle_vm.run (torch hooks, memoryview)",
         lambda: pickle_vm.run(view, hooks=TORCH_HOOKS, persistent_load=lambda pid, pos: pid)),
        ("pickletools.genops (decode only)", lambda: genops(data)),
        ("torch weights_only Unpickler (meta storages)", lambda: torch_weights_only(data)),
        ("C _pickle Unpickler, stub globals (reference)", lambda: c_pickle(data)),
    ]
    results = []
    for name, fn in cases:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")     # weights_only warns on protocol != 2
                fn()
        except Exception as exc:    # weights_only: "Unsupported operand 149" on protocol 4
            print(f"  ({name}: {type(exc).__name__}: {str(exc)[:60]})")
            results.append((name, None))
            continue
        results.append((name, best_of(fn, repeat)))
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--protocols", default="2,4")
    args = ap.parse_args(argv)

    print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, best of {args.repeat} "
          f"(CPU time)")
    for protocol in [int(p) for p in args.protocols.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            data = make_data_pkl(args.tensors, Path(tmp), protocol)
        ops = sum(1 for _ in pickletools.genops(data))
        results = bench(data, args.tensors, args.repeat)
        ours = results[1][1]
        print(f"\ndata.pkl protocol {protocol}: {len(data):,} bytes, {ops:,} opcodes, "
              f"{args.tensors:,} tensors")
        print(f"{'reader':<48} {'ms/file':>9} {'Mops/s':>8} {'x ours (hooks)':>15}")
        for name, seconds in results:
            if seconds is None:
                print(f"{name:<48} {'unsupported':>9}")
                continue
            print(f"{name:<48} {seconds * 1e3:9.1f} {ops / seconds / 1e6:8.2f} "
                  f"{seconds / ours:15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
