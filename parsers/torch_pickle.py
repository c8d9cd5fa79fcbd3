"""What torch's pickles mean, without torch: storages, rebuild functions, dtypes, tensor names.

Shared by every PyTorch container (zip, legacy stream, TorchScript, DCP, .pt2 blobs). The
container runs the pickle VM with `rebuild_hooks()` and a ``persistent_load`` that resolves
storages to bytes in its file; this module turns the resulting inert object tree into
`TensorInfo` records named as ``torch.load(...)`` / ``state_dict()`` would name them.

Spec (torch 2.13, see FORMATS.md):
- A storage persistent id is ``('storage', <storage class Global>, key: str, location: str,
  numel: int)`` (the legacy stream adds a 6th field, view metadata, normally None).
  ``numel`` counts elements of the storage class, bytes for ``UntypedStorage`` and ``QUInt4x2Storage``.
- ``torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
  backward_hooks[, metadata])``; ``_rebuild_tensor_v3(..., dtype[, metadata])`` takes its dtype
  from the 7th argument (the storage is untyped); ``_rebuild_tensor(storage, offset, size, stride)``
  is the pre-1.x form; ``_rebuild_parameter(tensor, requires_grad, hooks)`` and
  ``_rebuild_parameter_with_state(..., state)`` wrap a tensor; ``_rebuild_qtensor(storage, offset,
  size, stride, qparams, requires_grad, hooks)`` with qparams ``(per_tensor_affine, scale, zp)`` or
  ``(per_channel_affine[_float_qparams], scales, zero_points, axis)``;
  ``_rebuild_sparse_tensor(layout, data)``; ``_rebuild_meta_tensor_no_storage(dtype, size, stride,
  requires_grad)``; ``torch._tensor._rebuild_from_type_v2(func, type, args, state)`` wraps subclasses.
- Storages are whole; tensors are views: the first element is at ``storage_offset`` elements.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from tensorscope.dtypes import is_unknown
from tensorscope.errors import FormatError, brief
from tensorscope.model import FrozenDict, ModelFile, TensorInfo

from . import pickle_vm
from .pickle_vm import Call, Global

__all__ = ["StorageRef", "TensorRef", "SparseRef", "STORAGE_DTYPES", "TORCH_DTYPES", "parse_storage_pid",
           "rebuild_hooks", "named_tensors", "to_tensor_info", "ROOT_NAME"]

ROOT_NAME = "<root>"  # the name of a tensor saved on its own (torch.save(tensor)): it has no key
_NO_EXTRAS = FrozenDict()   # shared by the tensors without extras (read-only: copied to add)

# Storage classes -> dtype. TorchScript writes classes that do not exist in Python's torch
# namespace (UInt16Storage, Float8_e4m3fnStorage ...): the table covers them too.
STORAGE_DTYPES: dict[str, str | None] = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
    "ComplexHalfStorage": "complex32", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "QInt8Storage": "qint8", "QUInt8Storage": "quint8",
    "QInt32Storage": "qint32", "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
    "UInt16Storage": "uint16", "UInt32Storage": "uint32", "UInt64Storage": "uint64",
    "Float8_e4m3fnStorage": "float8_e4m3fn", "Float8_e5m2Storage": "float8_e5m2",
    "Float8_e4m3fnuzStorage": "float8_e4m3fnuz", "Float8_e5m2fnuzStorage": "float8_e5m2fnuz",
    "Float8_e8m0fnuStorage": "float8_e8m0fnu", "Float4_e2m1fn_x2Storage": "float4_e2m1fn_x2",
    "Bits8Storage": "bits8", "Bits16Storage": "bits16", "Bits1x8Storage": "bits1x8",
    "Bits2x4Storage": "bits2x4", "Bits4x2Storage": "bits4x2",
    "UntypedStorage": None,  # bytes; the tensor's dtype comes from _rebuild_tensor_v3
}
# torch.FloatStorage, torch.storage.UntypedStorage, torch.cuda.FloatStorage (a CUDA checkpoint).
STORAGE_MODULES = {"torch", "torch.storage", "torch.cuda"}
# Storage classes whose pid numel counts bytes rather than elements.
_NUMEL_IS_BYTES = {"UntypedStorage", "QUInt4x2Storage", "QUInt2x4Storage"}

# torch.<name> dtype globals (and their aliases) -> canonical dtype.
TORCH_DTYPES: dict[str, str] = {
    "float64": "float64", "double": "float64", "float32": "float32", "float": "float32",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16", "complex32": "complex32",
    "chalf": "complex32", "complex64": "complex64", "cfloat": "complex64",
    "complex128": "complex128", "cdouble": "complex128", "bool": "bool", "int8": "int8",
    "int16": "int16", "short": "int16", "int32": "int32", "int": "int32", "int64": "int64",
    "long": "int64", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "qint8": "qint8", "quint8": "quint8", "qint32": "qint32", "quint4x2": "quint4x2",
    "quint2x4": "quint2x4", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "float8_e4m3fnuz": "float8_e4m3fnuz", "float8_e5m2fnuz": "float8_e5m2fnuz",
    "float8_e8m0fnu": "float8_e8m0fnu", "float4_e2m1fn_x2": "float4_e2m1fn_x2",
    "bits8": "bits8", "bits16": "bits16", "bits1x8": "bits1x8", "bits2x4": "bits2x4",
    "bits4x2": "bits4x2",
}


@dataclass(slots=True, eq=False)
class StorageRef:
    """A storage named by a persistent id, resolved by the container to bytes in a file."""

    key: str
    dtype: str | None          # None for UntypedStorage (bytes)
    numel: int                 # as in the pid: elements, or bytes for untyped/quint4x2
    location: str
    file: str = ""
    member: str | None = None  # archive record holding the bytes (archive/data/0)
    data_offset: int | None = None  # absolute offset of the storage's first byte in `file`
    nbytes: int | None = None  # bytes the record really holds (the bound for reads)
    error: str | None = None   # why the bytes cannot be located


@dataclass(slots=True, eq=False)
class TensorRef:
    """An inert tensor: what a rebuild call would have produced."""

    storage: StorageRef | None
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    requires_grad: bool = False
    role: str = "tensor"
    pos: int = -1              # pickle offset of the rebuild call
    extras: dict[str, Any] = field(default_factory=dict)

    def with_role(self, role: str, **extras) -> "TensorRef":
        merged = dict(self.extras)
        merged.update(extras)
        return TensorRef(self.storage, self.storage_offset, self.shape, self.stride, self.dtype,
                         self.requires_grad, role, self.pos, merged)


@dataclass(slots=True, eq=False)
class SparseRef:
    """A sparse tensor: named components (indices/values, crow_indices/col_indices/values)."""

    layout: str
    shape: tuple[int, ...]
    components: dict[str, TensorRef]
    pos: int = -1


def _err(reason: str, pos: int) -> FormatError:
    # The VM adds file/member and turns pickle positions into absolute offsets.
    return pickle_vm.PickleError(reason, offset=pos)


def _int(value, what: str, pos: int, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _err(f"{what} must be an integer >= {minimum}, got {brief(value, 60)}", pos)
    return value


_INT_ONLY = frozenset((int,))


_CHECKED: dict[tuple, tuple] = {}  # tuples found valid, by identity (the VM shares shape tuples)


def _int_tuple(value, what: str, pos: int) -> tuple[int, ...]:
    # Fast path (every tensor of a checkpoint): a short tuple of non-negative plain ints, or the
    # very object already found to be one (an equal tuple of floats or bools is another object).
    if type(value) is tuple:
        try:
            if _CHECKED.get(value) is value:
                return value
        except TypeError:   # unhashable items: the checks below say what is wrong
            pass
        if len(value) <= 64 and (
                not value or ({*map(type, value)} <= _INT_ONLY and min(value) >= 0)):
            if len(_CHECKED) < 4096:
                _CHECKED[value] = value
            return value
    if not isinstance(value, (tuple, list)):
        raise _err(f"{what} must be a tuple of integers, got {type(value).__name__}", pos)
    if len(value) > 64:
        raise _err(f"{what} has {len(value)} dimensions (more than 64)", pos)
    return tuple(_int(v, what, pos) for v in value)


def torch_dtype(value, pos: int, *, unknown_itemsize: int | None = None) -> str:
    """The canonical name of a ``torch.<dtype>`` global. With ``unknown_itemsize``, a ``torch.*``
    name outside the table (a newer torch's dtype) becomes ``unknown:torch.<name>`` of that
    itemsize instead of an error: the tensor is listed with raw bytes (and an anomaly)."""
    if isinstance(value, Global) and value.module == "torch":
        if value.name in TORCH_DTYPES:
            return TORCH_DTYPES[value.name]
        if unknown_itemsize is not None and value.name.isidentifier():
            from tensorscope.dtypes import register_unknown
            return register_unknown(value.dotted, unknown_itemsize)
    raise _err(f"expected a torch dtype, got {_describe(value)}", pos)


def _describe(value) -> str:
    if isinstance(value, Global):
        return value.dotted
    return f"{type(value).__name__} {brief(value, 40)}"


def parse_storage_pid(pid, pos: int, *, allow_unknown: bool = False
                      ) -> tuple[str | None, str, str, int, str]:
    """``('storage', cls, key, location, numel[, view])`` -> (dtype, key, location, nbytes-or-numel,
    class name). Raises FormatError for any other shape (torch would fail the same way).

    ``allow_unknown`` (containers whose records carry their own size: zip archives): a storage
    class of a torch module that is not in the table (a newer torch's ``Float3Storage``) gives the
    dtype ``unknown:Float3Storage`` instead of an error; the container may refine its itemsize."""
    if type(pid) is tuple and len(pid) == 5 and type(pid[1]) is Global and type(pid[2]) is str \
            and type(pid[3]) is str and type(pid[4]) is int and pid[4] >= 0 and pid[0] == "storage":
        # Fast path: the form torch.save writes (checked field by field as below).
        cls = pid[1]
        if cls.module in STORAGE_MODULES and cls.name in STORAGE_DTYPES:
            return STORAGE_DTYPES[cls.name], pid[2], pid[3], pid[4], cls.name
    if not isinstance(pid, tuple) or len(pid) not in (5, 6) or pid[0] != "storage":
        raise _err(f"unsupported persistent id {brief(pid, 80)}", pos)
    cls, key, location, numel = pid[1], pid[2], pid[3], pid[4]
    if allow_unknown and isinstance(cls, Global) and cls.module in STORAGE_MODULES \
            and cls.name not in STORAGE_DTYPES and cls.name.isidentifier() \
            and cls.name.endswith("Storage"):
        from tensorscope.dtypes import register_unknown
        if not isinstance(key, str) or not isinstance(location, str):
            raise _err(f"storage key and location must be strings in persistent id {brief(pid, 80)}", pos)
        return register_unknown(cls.name), key, location, _int(numel, "storage size", pos), cls.name
    if not isinstance(cls, Global) or cls.module not in STORAGE_MODULES or cls.name not in STORAGE_DTYPES:
        raise _err(f"unknown storage class {_describe(cls)} in persistent id", pos)
    if not isinstance(key, str) or not isinstance(location, str):
        raise _err(f"storage key and location must be strings in persistent id {brief(pid, 80)}", pos)
    numel = _int(numel, "storage size", pos)
    return STORAGE_DTYPES[cls.name], key, location, numel, cls.name


def storage_nbytes_claimed(storage: StorageRef, class_name: str) -> int:
    """Bytes the pid says the storage holds."""
    from tensorscope.dtypes import spec
    if class_name in _NUMEL_IS_BYTES or storage.dtype is None:
        return storage.numel
    return storage.numel * spec(storage.dtype).itemsize


# -- rebuild hooks ------------------------------------------------------------------------------
def _storage(value, pos: int) -> StorageRef:
    if not isinstance(value, StorageRef):
        raise _err(f"expected a storage, got {_describe(value)}", pos)
    return value


def _dense(storage, offset, size, stride, pos, dtype=None, requires_grad=False) -> TensorRef:
    if type(storage) is not StorageRef:
        storage = _storage(storage, pos)
    if type(offset) is not int or offset < 0:
        offset = _int(offset, "storage_offset", pos)
    shape = _int_tuple(size, "size", pos)
    strides = _int_tuple(stride, "stride", pos)
    if len(strides) != len(shape):
        raise _err(f"stride {strides} does not match size {shape}", pos)
    if dtype is None:
        dtype = storage.dtype
        if dtype is None:
            raise _err("an untyped storage needs _rebuild_tensor_v3's dtype argument", pos)
    return TensorRef(storage, offset, shape, strides, dtype, bool(requires_grad), "tensor", pos,
                     _NO_EXTRAS)


def _args(args, n_min: int, n_max: int, name: str, pos: int) -> tuple:
    if not isinstance(args, tuple) or not n_min <= len(args) <= n_max:
        count = len(args) if isinstance(args, tuple) else type(args).__name__
        raise _err(f"{name} takes {n_min}..{n_max} arguments, got {count}", pos)
    return args


def _rebuild_tensor(args, pos):
    a = _args(args, 4, 4, "_rebuild_tensor", pos)
    return _dense(a[0], a[1], a[2], a[3], pos)


def _rebuild_tensor_v2(args, pos):
    a = args if type(args) is tuple and 6 <= len(args) <= 7 else _args(
        args, 6, 7, "_rebuild_tensor_v2", pos)
    return _dense(a[0], a[1], a[2], a[3], pos, None, a[4] is True)


def _rebuild_tensor_v3(args, pos):
    a = _args(args, 7, 8, "_rebuild_tensor_v3", pos)
    return _dense(a[0], a[1], a[2], a[3], pos, dtype=torch_dtype(a[6], pos, unknown_itemsize=
                  _itemsize_guess(a)), requires_grad=a[4] is True)


def _itemsize_guess(a) -> int:
    """Bytes per element of a tensor of unknown dtype over an untyped storage: the storage's bytes
    over the tensor's elements when the tensor is the whole storage, laid out contiguously; else 1."""
    storage, offset, size = a[0], a[1], a[2]
    if isinstance(storage, StorageRef) and offset == 0 and isinstance(size, tuple) and \
            all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in size):
        n = math.prod(size)
        if n and storage.numel % n == 0 and 0 < storage.numel // n <= 64:
            return storage.numel // n
    return 1


def _tensor_arg(value, what, pos) -> TensorRef:
    if not isinstance(value, TensorRef):
        raise _err(f"{what} must be a tensor, got {_describe(value)}", pos)
    return value


def _rebuild_parameter(args, pos):
    a = _args(args, 3, 3, "_rebuild_parameter", pos)
    t = _tensor_arg(a[0], "_rebuild_parameter's data", pos)
    out = t.with_role("parameter")
    out.requires_grad = a[1] is True
    return out


def _rebuild_parameter_with_state(args, pos):
    a = _args(args, 4, 4, "_rebuild_parameter_with_state", pos)
    out = _rebuild_parameter(a[:3], pos)
    if a[3]:
        out.extras["state"] = _summ(a[3])
    return out


def _summ(value) -> str:
    return brief(value, 200)


_QSCHEMES = {"per_tensor_affine", "per_channel_affine", "per_channel_affine_float_qparams",
             "per_tensor_symmetric", "per_channel_symmetric"}


def _rebuild_qtensor(args, pos):
    a = _args(args, 7, 7, "_rebuild_qtensor", pos)
    t = _dense(a[0], a[1], a[2], a[3], pos, requires_grad=a[5] is True)
    q = a[4]
    if not isinstance(q, tuple) or not q or not isinstance(q[0], Global) or q[0].name not in _QSCHEMES:
        raise _err(f"unsupported quantizer parameters {brief(q, 80)}", pos)
    scheme = q[0].name
    extras: dict[str, Any] = {"qscheme": scheme}
    if scheme in ("per_tensor_affine", "per_tensor_symmetric") and len(q) == 3:
        extras["scale"], extras["zero_point"] = q[1], q[2]
    elif scheme.startswith("per_channel") and len(q) == 4:
        scales, zps, axis = q[1], q[2], q[3]
        if isinstance(scales, TensorRef) and isinstance(zps, TensorRef):
            # Only the zero points' dtype tells per_channel_affine_float_qparams apart.
            if scheme == "per_channel_affine" and zps.dtype in ("float32", "float16", "float64"):
                extras["qscheme"] = "per_channel_affine_float_qparams"
            extras["scales"] = _ref_summary(scales)
            extras["zero_points"] = _ref_summary(zps)
        else:
            extras["scales"], extras["zero_points"] = _summ(scales), _summ(zps)
        extras["axis"] = axis
    else:
        raise _err(f"malformed quantizer parameters for {scheme}", pos)
    out = t.with_role("tensor", **extras)
    return out


def _ref_summary(t: TensorRef) -> dict[str, Any]:
    s = t.storage
    return {"dtype": t.dtype, "shape": list(t.shape), "storage_key": s.key if s else None,
            "byte_offset": None if s is None or s.data_offset is None else
            s.data_offset + _offset_bytes(t.dtype, t.storage_offset)}


def _offset_bytes(dtype: str, elements: int) -> int:
    """Bytes before element ``elements`` of a storage (packed types hold several per byte)."""
    from tensorscope.dtypes import spec
    return elements * spec(dtype).bits // 8


def _bits(dtype: str) -> int:
    from tensorscope.dtypes import spec
    return spec(dtype).bits


def _rebuild_meta(args, pos):
    a = _args(args, 4, 4, "_rebuild_meta_tensor_no_storage", pos)
    shape = _int_tuple(a[1], "size", pos)
    stride = _int_tuple(a[2], "stride", pos)
    if len(shape) != len(stride):
        raise _err(f"stride {stride} does not match size {shape}", pos)
    return TensorRef(None, 0, shape, stride, torch_dtype(a[0], pos), a[3] is True, "tensor", pos,
                     {"device": "meta"})


_SPARSE_COMPONENTS = {
    "sparse_coo": ("indices", "values"),
    "sparse_csr": ("crow_indices", "col_indices", "values"),
    "sparse_csc": ("ccol_indices", "row_indices", "values"),
    "sparse_bsr": ("crow_indices", "col_indices", "values"),
    "sparse_bsc": ("ccol_indices", "row_indices", "values"),
}


def _rebuild_sparse(args, pos):
    a = _args(args, 2, 2, "_rebuild_sparse_tensor", pos)
    layout, data = a
    name = layout.name if isinstance(layout, Global) else layout if isinstance(layout, str) else None
    if name not in _SPARSE_COMPONENTS or not isinstance(data, tuple):
        raise _err(f"unsupported sparse layout {_describe(layout)}", pos)
    parts = _SPARSE_COMPONENTS[name]
    comps = {}
    for part, value in zip(parts, data):
        comps[part] = _tensor_arg(value, f"sparse {part}", pos)
    size = data[len(parts)] if len(data) > len(parts) else ()
    return SparseRef(name, _int_tuple(size, "sparse size", pos), comps, pos)


def _get_layout(args, pos):
    a = _args(args, 1, 1, "_get_layout", pos)
    if not isinstance(a[0], str):
        raise _err("_get_layout takes a layout name", pos)
    return a[0].replace("torch.", "")


def _torch_size(args, pos):
    a = _args(args, 1, 1, "torch.Size", pos)
    return tuple(a[0]) if isinstance(a[0], (tuple, list)) else a[0]


_REBUILDERS: dict[tuple[str, str], Callable] = {
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter_with_state,
    ("torch._utils", "_rebuild_qtensor"): _rebuild_qtensor,
    ("torch._utils", "_rebuild_sparse_tensor"): _rebuild_sparse,
    ("torch._utils", "_rebuild_meta_tensor_no_storage"): _rebuild_meta,
}


def _rebuild_from_type_v2(args, pos):
    """``_rebuild_from_type_v2(func, new_type, args, state)``: a tensor subclass (or Parameter)."""
    a = _args(args, 4, 4, "_rebuild_from_type_v2", pos)
    func, new_type, inner, _state = a
    key = (func.module, func.name) if isinstance(func, Global) else None
    if key not in _REBUILDERS or not isinstance(inner, tuple):
        return None  # not a tensor we can place: stays an inert call
    t = _REBUILDERS[key](inner, pos)
    if isinstance(t, TensorRef) and isinstance(new_type, Global):
        if new_type.dotted == "torch.nn.parameter.Parameter":
            return t.with_role("parameter")
        if new_type.dotted not in ("torch.Tensor", "torch._tensor.Tensor"):
            return t.with_role(t.role, subclass=new_type.dotted)
    return t


# The compiled torch step (`pickle_vm._STEP`) makes a StorageRef and `_dense`'s plain TensorRef
# by filling their slots, as their dataclass `__init__` would: only while that is all it does.
if pickle_vm._STEP is not None:
    try:
        if hasattr(StorageRef, "__post_init__") or hasattr(TensorRef, "__post_init__"):
            raise TypeError("a __post_init__ the compiled step would skip")
        pickle_vm._STEP.bind_torch(StorageRef, TensorRef, _rebuild_tensor_v2, _NO_EXTRAS,
                                   TensorInfo, FrozenDict)
    except TypeError:   # other fields than it knows: a stale build (the tests fail on this)
        pickle_vm._STEP = None


def rebuild_hooks() -> dict[tuple[str, str], Callable]:
    """VM hooks: torch's rebuild functions become TensorRefs; containers become data."""
    hooks = dict(pickle_vm.CONTAINER_HOOKS)
    hooks.update(_REBUILDERS)
    hooks[("torch._tensor", "_rebuild_from_type_v2")] = _hook_or_call(_rebuild_from_type_v2)
    hooks[("torch.serialization", "_get_layout")] = _get_layout
    hooks[("torch", "Size")] = _torch_size
    return hooks


def _hook_or_call(fn):
    """A hook that may decline (None): the VM then keeps its own inert Call (real global, real
    opcode), which it has already recorded."""
    def hook(args, pos):
        out = fn(args, pos)
        return out if out is not None else pickle_vm.DECLINE
    return hook


# -- naming ---------------------------------------------------------------------------------------
def _is_module_state(state) -> bool:
    return isinstance(state, dict) and "_parameters" in state and "_modules" in state


def named_tensors(root, *, max_items: int = 10_000_000, max_depth: int = 1000,
                  leaf: Callable[[Call], TensorRef | None] | None = None, consume: bool = False,
                  ) -> Iterator[tuple[tuple[str, ...], tuple[str, ...], TensorRef]]:
    """Yield ``(path, raw_path, tensor)`` in saved order.

    ``leaf`` MAY turn an inert `Call` into a tensor before the walk descends into it (plain
    pickles use it for numpy arrays, whose data arrives by BUILD after the call).

    ``path`` is the state_dict-style path (``features.0.weight``): dict keys, list indices,
    attribute names, and for ``nn.Module`` objects the ``_parameters``/``_buffers``/``_modules``
    levels folded away. ``raw_path`` keeps every level. Each container is expanded once (a
    shared sub-object is named at its first path), which bounds the walk by the object count.
    Containers more than ``max_depth`` levels down are not expanded: every level copies its
    path, so a million-deep list would otherwise cost O(depth^2) (hostile input, issue #9).
    Sparse tensors yield one entry per component (``name.indices``, ``name.values``).
    ``consume``: a flat state dict's values are set to None as they are yielded, so that each
    tensor's inert objects can be freed as soon as the caller has made its record (the tree is
    not kept: ``listing_only``).
    """
    seen: set[int] = set()
    # Stack of (obj, path, raw_path, role); children are pushed reversed to keep saved order.
    stack: list[tuple[Any, tuple, tuple, str | None]] = [(root, (), (), None)]
    emitted = 0
    while stack:
        obj, path, raw, role = stack.pop()
        if leaf is not None and type(obj) is Call:
            obj = leaf(obj) or obj
        if isinstance(obj, TensorRef):
            emitted += 1
            if emitted > max_items:
                return
            t = obj if role is None or obj.role == "parameter" else obj.with_role(role)
            yield path, raw, t
            continue
        if isinstance(obj, SparseRef):
            for comp, t in obj.components.items():
                extras = {"sparse_layout": obj.layout, "sparse_shape": list(obj.shape), "component": comp}
                yield path + (comp,), raw + (comp,), t.with_role(role or t.role, **extras)
            continue
        if not isinstance(obj, (dict, list, tuple, Call)) or id(obj) in seen or len(raw) > max_depth:
            continue
        seen.add(id(obj))
        if type(obj) is dict and role is None and {*map(type, obj.values())} == _TENSOR_ONLY and \
                {*map(type, obj)} == _STR_ONLY and emitted + len(obj) <= max_items:
            # A flat state dict (string keys, tensors only): what the general walk would yield,
            # without a stack entry and two path tuples per tensor.
            emitted += len(obj)
            for k, v in obj.items():
                p = path + (k,)
                if consume:
                    obj[k] = None   # a value replaced, not a key: the iteration goes on
                yield p, (raw + (k,) if raw else p), v
            continue
        children: list[tuple[Any, tuple, tuple, str | None]] = []
        if isinstance(obj, dict):
            for k, v in obj.items():
                if not _may_hold(v):
                    continue
                children.append((v, path + (_key(k),), raw + (_key(k),), role))
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                if not _may_hold(v):
                    continue
                children.append((v, path + (str(i),), raw + (str(i),), role))
        else:  # an inert object: its state (attributes), then what it was built from
            state = obj.state
            if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
                state = {**(state[0] or {}), **state[1]} if isinstance(state[0], dict) else state[1]
            if _is_module_state(state):
                children.extend(_module_children(state, path, raw))
            elif isinstance(state, dict):
                for k, v in state.items():
                    if not _may_hold(v):
                        continue
                    children.append((v, path + (_key(k),), raw + (_key(k),), role))
            elif state is not pickle_vm.NOTSET and state is not None:
                children.append((state, path, raw + ("__state__",), role))
            for i, v in enumerate(obj.args or ()):
                if not _may_hold(v):
                    continue
                children.append((v, path + (str(i),), raw + ("__args__", str(i)), role))
            for i, v in enumerate(obj.items):
                if not _may_hold(v):
                    continue
                children.append((v, path + (str(i),), raw + (str(i),), role))
            for k, v in obj.dictitems:
                if not _may_hold(v):
                    continue
                children.append((v, path + (_key(k),), raw + (_key(k),), role))
        stack.extend(reversed(children))


_TENSOR_ONLY = {TensorRef}
_STR_ONLY = {str}

_INERT = frozenset({str, int, float, bool, complex, bytes, bytearray, type(None), Global})
_BUILTIN_CONTAINERS = frozenset({dict, list, tuple})


def is_flat_state_dict(obj, max_items: int = 10_000_000) -> bool:
    """True for what `named_tensors` walks as a flat state dict (at its root): a dict of str
    keys and TensorRef values, at most ``max_items``, names ``(key,)`` in saved order."""
    if type(obj) is not dict or len(obj) > max_items:
        return False
    if pickle_vm._STEP is not None:
        return pickle_vm._STEP.is_flat(obj)
    return {*map(type, obj.values())} == _TENSOR_ONLY and {*map(type, obj)} == _STR_ONLY


def whole_byte_itemsizes() -> dict[str, int]:
    """``{dtype: bytes per element}`` for the known dtypes of whole bytes per element (not
    packed, not blocks): their byte counts are element counts times that (`_nbytes`,
    `_cached_bits`)."""
    from tensorscope.dtypes import DTYPES
    return {name: s.bits // 8 for name, s in DTYPES.items()
            if s.kind not in ("block", "unknown") and s.bits > 0 and s.bits % 8 == 0
            and not name.startswith("unknown:")}


def _may_hold(value) -> bool:
    """False for what holds no tensor (a scalar, an empty container): the walk gives it no entry
    and no path copies, so 10^5 empty dicts in one list cost a test each (fuzz: they cost the
    walk six times the VM's own run)."""
    t = type(value)
    return t not in _INERT and (t not in _BUILTIN_CONTAINERS or bool(value))


def _module_children(state: dict, path: tuple, raw: tuple):
    non_persistent = state.get("_non_persistent_buffers_set")
    non_persistent = set(non_persistent) if isinstance(non_persistent, (set, frozenset, list)) else set()
    for attr, value in state.items():
        if attr == "_parameters" and isinstance(value, dict):
            for k, v in value.items():
                yield v, path + (_key(k),), raw + ("_parameters", _key(k)), "parameter"
        elif attr == "_buffers" and isinstance(value, dict):
            for k, v in value.items():
                role = "buffer(non-persistent)" if k in non_persistent else "buffer"
                yield v, path + (_key(k),), raw + ("_buffers", _key(k)), role
        elif attr == "_modules" and isinstance(value, dict):
            for k, v in value.items():
                yield v, path + (_key(k),), raw + ("_modules", _key(k)), None
        elif isinstance(attr, str) and not attr.startswith("_"):  # hostile keys: ints, objects
            # Plain attributes that hold tensors (self.scale = torch.ones(1)) keep their names.
            yield value, path + (attr,), raw + (attr,), None


def _key(k) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, Global):
        return k.dotted
    if isinstance(k, bytes):
        return k.decode("latin-1")
    return str(k)


def dotted(path: tuple[str, ...]) -> str:
    return ".".join(path) if path else ROOT_NAME


def to_tensor_info(path: tuple[str, ...], raw: tuple[str, ...], t: TensorRef, *, fmt: str,
                   file: str = "") -> TensorInfo:
    """A TensorInfo from a TensorRef whose storage the container has resolved."""
    s = t.storage
    if (s is not None and s.error is None and s.data_offset is not None and s.member
            and t.extras is _NO_EXTRAS and not t.requires_grad
            and (raw is path or raw == path or not raw)):
        # A state dict's tensor from `_dense` (the only maker of refs with the shared
        # `_NO_EXTRAS`): shape and stride are tuples of ints of one length, the dtype a canonical
        # name, so the record is made without TensorInfo's re-validation.
        offset = t.storage_offset
        dtype = t.dtype
        shape = t.shape
        nbytes = _NBYTES.get((dtype, shape))
        if nbytes is None:
            nbytes = _nbytes(dtype, shape)
        return _trusted(
            dotted(path), dtype, shape, t.stride, offset,
            s.data_offset + (offset * _cached_bits(dtype) // 8 if offset else 0), nbytes,
            s.file or file, s.key, s.nbytes, path or (ROOT_NAME,), fmt, t.role, (),
            FrozenDict(location=s.location, member=s.member))
    if (s is not None and s.error is None and s.data_offset is not None and s.member
            and not t.extras and not t.requires_grad and (raw is path or raw == path or not raw)):
        # The usual tensor (a state dict's): the general case below, in one step.
        offset = t.storage_offset
        dtype = t.dtype
        return TensorInfo(
            dotted(path), dtype, t.shape, t.stride, offset,
            s.data_offset + (offset * _cached_bits(dtype) // 8 if offset else 0), -1,
            s.file or file, s.key, s.nbytes, path or (ROOT_NAME,), fmt, t.role, (),
            FrozenDict(location=s.location, member=s.member))
    extras = dict(t.extras) if t.extras else {}
    if t.requires_grad:
        extras["requires_grad"] = True
    if raw and raw != path:
        extras["raw_path"] = ".".join(raw)
    byte_offset = storage_nbytes = None
    storage_key = None
    dtype = t.dtype
    if s is not None:
        storage_key = s.key
        extras["location"] = s.location
        if s.data_offset is not None and s.error is None:
            offset = t.storage_offset
            byte_offset = s.data_offset + (offset * _cached_bits(dtype) // 8 if offset else 0)
            storage_nbytes = s.nbytes
        if s.error:
            extras["error"] = s.error
        if s.member:
            extras["member"] = s.member
    return TensorInfo(
        dotted(path), dtype, t.shape, t.stride, t.storage_offset, byte_offset, -1,
        s.file if s is not None and s.file else file, storage_key, storage_nbytes,
        path or (ROOT_NAME,), fmt, t.role, (), FrozenDict(extras))


_trusted = TensorInfo.trusted
_NBYTES: dict[tuple[str, tuple[int, ...]], int] = {}   # (dtype, shape) -> contiguous bytes


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """`dtypes.nbytes_for` of a shape, remembered for known dtypes (checkpoints repeat shapes)."""
    from tensorscope.dtypes import nbytes_for, spec
    spec(dtype)     # an unknown name is a programming error, as in TensorInfo
    nbytes = nbytes_for(dtype, math.prod(shape))
    if not dtype.startswith("unknown:") and len(_NBYTES) < 4096:
        _NBYTES[dtype, shape] = nbytes
    return nbytes


_BITS: dict[str, int] = {}


def _cached_bits(dtype: str) -> int:
    """`_bits`, looked up once per dtype (it runs for every tensor)."""
    bits = _BITS.get(dtype)
    if bits is None:
        bits = _bits(dtype)
        if not dtype.startswith("unknown:"):  # an unknown dtype's itemsize may be refined
            _BITS[dtype] = bits
    return bits


def note_unknown_dtype(model, info: TensorInfo) -> None:
    """The anomaly for a tensor whose dtype this tool does not know (listed with raw bytes)."""
    model.evidence.add("torch.unknown_dtype", f"tensor {info.name!r} has dtype "
                       f"{info.dtype.partition(':')[2]}, which this tool does not know: listed with "
                       "its raw bytes", file=info.file, member=info.extras.get("member"))


def tensor_fits(t: TensorRef) -> bool:
    """True when the tensor's last addressed element lies inside its storage record."""
    s = t.storage
    if s is None or s.nbytes is None:
        return True
    key = (t.shape, t.stride)
    span = _SPANS.get(key, False)
    if span is False:
        span = _span(t.shape, t.stride)
        if len(_SPANS) < 4096:      # checkpoints repeat a few layouts
            _SPANS[key] = span
    if span is None:
        return True
    return -(-(t.storage_offset + span + 1) * _cached_bits(t.dtype) // 8) <= s.nbytes


_SPANS: dict[tuple, int | None] = {}


def _span(shape, stride) -> int | None:
    """Elements from the first addressed element to the last; None when a dimension is 0."""
    last = 0
    for d, st in zip(shape, stride):
        if d == 0:
            return None
        last += (d - 1) * st
    return last


# -- records: the tensors of an unpickled checkpoint, checked against their storages -------------
def build_tensor_list(root, fmt: str, file: str, model: ModelFile, consume: bool = False) -> list:
    """Name every tensor in ``root`` and check each against its storage record (``consume``:
    see `named_tensors`)."""
    tensors: list = []
    unknown: dict[str, bool] = {}     # dtype -> is_unknown (a checkpoint has a handful)
    if consume and pickle_vm._STEP is not None and is_flat_state_dict(root):
        # The compiled step makes the records of the plain tensors (what `to_tensor_info`'s first
        # branch makes, when the tensor fits its storage and its dtype has whole bytes per
        # element) and hands back each other item, which is made here as below, in its place.
        infos, itemsizes, at = pickle_vm._STEP.infos, whole_byte_itemsizes(), 0
        while (left := infos(root, at, tensors, fmt, file, itemsizes, True)) is not None:
            at, key, ref = left
            root[key] = None
            path = (key,)
            _add_records(tensors, model, ((path, path, ref),), fmt, file, unknown)
        return tensors
    _add_records(tensors, model, named_tensors(root, consume=consume), fmt, file,
                 unknown)
    return tensors


def _add_records(tensors: list, model: ModelFile, named, fmt: str, file: str,
                 unknown: dict[str, bool]) -> None:
    """Append the record of each ``(path, raw_path, TensorRef)``, with the anomalies its storage
    shows."""
    append = tensors.append
    for path, raw, ref in named:
        info = to_tensor_info(path, raw, ref, fmt=fmt, file=file)
        s = ref.storage
        if s is not None and s.error:
            model.evidence.add("torch.storage_unreadable", f"tensor {info.name!r}: {s.error}",
                               file=s.file, member=s.member)
        elif not tensor_fits(ref):
            model.evidence.add(
                "torch.tensor_out_of_storage",
                f"tensor {info.name!r} addresses bytes past the end of its storage record "
                f"({s.nbytes} bytes)", file=s.file, member=s.member)
        dtype = info.dtype
        u = unknown.get(dtype)
        if u is None:
            u = unknown[dtype] = is_unknown(dtype)
        if u:
            note_unknown_dtype(model, info)
        append(info)


def install_byteswap_readers(model: ModelFile) -> None:
    """Big-endian archives: reads return a byte-swapped copy in native order (documented copy)."""
    from tensorscope.reader import strided_view
    for info in model.tensors:
        def reader(info=info):
            view = strided_view(model, info)
            return view.byteswap() if view.dtype.itemsize > 1 else view
        model.custom_readers[info.name] = reader
