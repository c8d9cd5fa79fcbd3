"""What a pickle may import: every global judged on its own, in three kinds.

The scanner judges every global a pickle names (``GLOBAL``, ``STACK_GLOBAL``, ``INST``, ``OBJ``
via the class on the stack) by its full dotted name, ``module.qualname``, the way torch's
weights-only unpickler judges it at the ``GLOBAL`` opcode: by what it IS. What the pickle is seen
to do with it (a call, an argument handed to a caller that calls it) only adds evidence to the
message (`tensorscope.scanning.pickles`), never lowers the verdict.

1. **Code-running** (`DENIED`): callables and modules that evaluate strings, import by name, start
   processes, load native code or further pickles, write files or open sockets. CRITICAL when
   merely imported (a global can be reached later through ``BUILD``/``__setstate__``, a caller
   that calls its arguments, memo tricks or a second stage). Three sources: `DENYLIST` (hand
   written, cited), `STDLIB_CODE_RUNNING` (derived from the standard library's own source by
   tools/derive_stdlib_gadgets.py, with the reaching path per entry) and
   `THIRD_PARTY_CODE_RUNNING` (a reviewed hand list with a reason and a source per entry), both
   data in ``policy_data/``.
2. **Known inert**: `ALLOWED` (`WEIGHTS_ONLY_GLOBALS`, torch 2.13's own allowlist, plus NumPy's
   array reconstruction and builtin containers: no finding) and `FRAMEWORK` (`FRAMEWORK_PREFIXES`:
   torch nn modules, TorchScript classes, DCP metadata, torch.Generator, NumPy random state,
   pathlib paths ... whose construction and ``__setstate__`` run nothing the file chose: INFO,
   with a note that a weights-only load still refuses them). A prefix covers classes only.
3. **Unknown** (`UNKNOWN`): everything else, at least MEDIUM, called or not. A class of a known
   library (`KNOWN_LIBRARIES`, `library_of`) is "review" (MEDIUM at most for Enum members, dtypes
   and value classes); user code called with a string from the file is HIGH.

Names are normalised first, as ``pickle.Unpickler.find_class`` does for protocols < 3
(``_compat_pickle``: ``__builtin__`` -> ``builtins``, ``copy_reg`` -> ``copyreg``...), and C
accelerator modules are folded onto the modules they implement (``_pickle`` -> ``pickle``,
``posix``/``nt`` -> ``os``, ``_operator`` -> ``operator``...) so that an alias never escapes a rule.
Matching is by dotted prefix at name boundaries: an entry ``asyncio`` covers
``asyncio.unix_events._UnixSubprocessTransport`` (the sub-module bypass of CVE-2025-10157), and an
entry ``builtins.getattr`` covers ``builtins.getattr.__call__``.
A dotted name is also judged along its attribute path, since protocol 4 resolves it by
``getattr`` steps: every tail is matched (``torch.nn.modules.module`` + ``torch.load`` is
``torch.load``; ``collections`` + ``_sys.modules`` is ``sys``), a method reached through a
framework class is judged by use rather than as the class, module paths through a vendored
cloudpickle/dill are denied, and so is any name whose final part only command runners carry
(``system``, ``popen``, ``check_output``...), whatever module re-exports it.

Sources for the tables are cited next to each entry; the weights-only table is copied from
torch 2.13 ``torch/_weights_only_unpickler.py`` ``_get_allowed_globals`` (facts only).

Public: `classify`, `normalize`, `Verdict`, `LOADER_CALLS`, `DENYLIST`, `WEIGHTS_ONLY_GLOBALS`,
`TORCHSCRIPT_CALL_PREFIXES`, `STANDARD_ONNX_DOMAINS`.
"""
from __future__ import annotations

import _compat_pickle
import json
import os
from dataclasses import dataclass

__all__ = ["Verdict", "classify", "normalize", "matches", "DENYLIST", "WEIGHTS_ONLY_GLOBALS",
           "NUMPY_GLOBALS", "CONTAINER_GLOBALS", "SAFE_GLOBALS", "FRAMEWORK_PREFIXES",
           "TRANSPARENT_CONSTRUCTORS", "LOADER_CALLS", "BYTES_WRAPPERS", "TORCHSCRIPT_CALL_PREFIXES",
           "STANDARD_ONNX_DOMAINS", "ALLOWED", "DENIED", "FRAMEWORK", "UNKNOWN", "KNOWN_LIBRARIES",
           "library_of", "STDLIB_CODE_RUNNING", "THIRD_PARTY_CODE_RUNNING", "STDLIB_COMPILE_ONLY"]

ALLOWED, DENIED, FRAMEWORK, UNKNOWN = "allowed", "denied", "framework", "unknown"

# --- 1. allowlist ---------------------------------------------------------------------------------
# torch 2.13 torch/_weights_only_unpickler.py _get_allowed_globals(): the literal table of what
# torch.load(weights_only=True) lets a checkpoint import. (Dtypes, storage and tensor classes are
# generated there from torch's own registries; the generated names are listed here.)
_DTYPES = ("bfloat16 bits16 bits1x8 bits2x4 bits4x2 bits8 bool complex128 complex32 complex64 "
           "float16 float32 float4_e2m1fn_x2 float64 float8_e4m3fn float8_e4m3fnuz float8_e5m2 "
           "float8_e5m2fnuz float8_e8m0fnu int1 int16 int2 int3 int32 int4 int5 int6 int64 int7 "
           "int8 qint32 qint8 quint2x4 quint4x2 quint8 uint1 uint16 uint2 uint3 uint32 uint4 uint5 "
           "uint6 uint64 uint7 uint8").split()
_TENSOR_TYPES = "BFloat16 Bool Byte Char Double Float Half Int Long Short".split()
_STORAGES = ("BFloat16 Bool Byte Char ComplexDouble ComplexFloat Double Float Half Int Long "
             "QInt32 QInt8 QUInt2x4 QUInt4x2 QUInt8 Short").split()
_REBUILD = ("_rebuild_device_tensor_from_cpu_tensor _rebuild_device_tensor_from_numpy "
            "_rebuild_meta_tensor_no_storage _rebuild_nested_tensor _rebuild_parameter "
            "_rebuild_parameter_with_state _rebuild_qtensor _rebuild_sparse_tensor _rebuild_tensor "
            "_rebuild_tensor_v2 _rebuild_tensor_v3 _rebuild_wrapper_subclass").split()
WEIGHTS_ONLY_GLOBALS: frozenset[str] = frozenset(
    ["collections.OrderedDict", "collections.Counter", "torch.nn.parameter.Parameter",
     "torch.serialization._get_layout", "torch.Size", "torch.Tensor", "torch.device",
     "_codecs.encode", "builtins.bytearray", "builtins.set", "builtins.complex",
     "torch.storage.TypedStorage", "torch.storage.UntypedStorage",
     "torch._tensor._rebuild_from_type_v2",
     "torch.per_tensor_affine", "torch.per_tensor_symmetric", "torch.per_channel_affine",
     "torch.per_channel_symmetric", "torch.per_channel_affine_float_qparams"]
    + [f"torch.{d}" for d in _DTYPES]
    + [f"torch.{t}Tensor" for t in _TENSOR_TYPES]
    + [f"torch.cuda.{t}Tensor" for t in _TENSOR_TYPES]
    + [f"torch.sparse.{t}Tensor" for t in _TENSOR_TYPES if t != "Bool"]
    + [f"torch.cuda.sparse.{t}Tensor" for t in _TENSOR_TYPES if t != "Bool"]
    + [f"torch.{s}Storage" for s in _STORAGES]
    + [f"torch.cuda.{s}Storage" for s in _STORAGES if not s.startswith("Q")]
    + [f"torch._utils.{f}" for f in _REBUILD])

# Storage classes TorchScript writes that do not exist in Python's torch namespace (FORMATS.md):
# torch.load maps any "*Storage" name to a StorageType, so they are as inert as the ones above.
_EXTRA_STORAGES = frozenset(f"torch.{s}Storage" for s in (
    "UInt16 UInt32 UInt64 Float8_e4m3fn Float8_e5m2 Float8_e4m3fnuz Float8_e5m2fnuz "
    "Float8_e8m0fnu Float4_e2m1fn_x2 ComplexHalf Untyped").split())

# NumPy's own array reconstruction (what np.save of an object array and pickled ndarrays use).
NUMPY_GLOBALS: frozenset[str] = frozenset({
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
    "numpy.ndarray", "numpy.dtype", "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar", "numpy.dtypes.Float64DType", "numpy.dtypes.Float32DType",
})
# numpy.dtypes.*DType classes are plain dtype classes (numpy >= 1.25 pickles them by name).
_NUMPY_DTYPE_PREFIX = "numpy.dtypes."

# Builtin containers and values: constructing them runs no user code.
CONTAINER_GLOBALS: frozenset[str] = frozenset({
    "builtins.set", "builtins.frozenset", "builtins.bytearray", "builtins.complex",
    "builtins.list", "builtins.dict", "builtins.tuple", "builtins.int", "builtins.float",
    "builtins.bool", "builtins.str", "builtins.bytes", "builtins.slice", "builtins.range",
    "builtins.NoneType", "builtins.Ellipsis", "builtins.NotImplemented",
    "collections.OrderedDict", "collections.Counter", "collections.defaultdict",
    "collections.deque", "_codecs.encode", "datetime.datetime", "datetime.date",
    "datetime.time", "datetime.timedelta", "datetime.timezone", "decimal.Decimal",
    "fractions.Fraction", "uuid.UUID",
    # train.py checkpoints save their arguments (fairseq, many repos): a bag of attributes that
    # BUILD fills in; constructing it runs no code of the file's choosing.
    "argparse.Namespace",
})

# Pure builtins: they compute a value from their arguments and call nothing they are given except
# the dunder methods of objects the pickle had to build first (and those objects' classes are
# judged on their own). Real pickles reach them through __reduce__ (len, getattr-free helpers);
# what is NOT here on purpose: getattr/setattr/eval... (denied), pow and bytes/bytearray of a huge
# int (memory), repr/format/print (call arbitrary __repr__/__format__, write to the terminal).
PURE_BUILTINS: frozenset[str] = frozenset(f"builtins.{n}" for n in (
    "len", "abs", "min", "max", "sum", "sorted", "round", "divmod", "isinstance", "issubclass",
    "callable", "hash", "id", "chr", "ord", "hex", "oct", "bin", "all", "any", "reversed", "zip",
    "enumerate"))

SAFE_GLOBALS: frozenset[str] = (WEIGHTS_ONLY_GLOBALS | _EXTRA_STORAGES | NUMPY_GLOBALS |
                                CONTAINER_GLOBALS | PURE_BUILTINS)

# copyreg's object-rebuilding helpers: what they make is decided by their first argument (the
# class), which the scanner judges instead. `copyreg._reconstructor(cls, object, None)` is how
# protocols 0/1 save an instance of a user class.
TRANSPARENT_CONSTRUCTORS: frozenset[str] = frozenset({
    "copyreg._reconstructor", "copyreg.__newobj__", "copyreg.__newobj_ex__",
})

# --- 3. framework classes (INFO) -------------------------------------------------------------------
# joblib.dump writes this placeholder for every NumPy array; joblib.load reads the raw array bytes
# that follow it (parsers/joblib_fmt.py). Its __init__ only stores shape/dtype/order and BUILD sets
# the same attributes; an object array's nested pickle is scanned as part of the file.
JOBLIB_WRAPPER_REASON = ("joblib's NumPy array placeholder (joblib.load reads the array bytes "
                         "that follow it; no code runs)")
# Prefix -> why importing it is not user code. torch.nn.modules.* is what torch.save(model) names
# for torch's own layers; __torch__.* are TorchScript compiled classes (resolved by the TorchScript
# loader, never imported from Python); the jit helpers and DCP dataclasses are torch's own writers.
FRAMEWORK_PREFIXES: dict[str, str] = {
    "torch.nn.modules.": "torch's own nn module class (importing it runs only torch code)",
    "torch.nn.parameter.": "torch's own Parameter classes",
    "torch.nn.utils.parametrize.": "torch's own parametrization classes",
    "torch.ao.nn.": "torch's own quantized nn module class",
    "torch.nn.quantized.": "torch's own quantized nn module class",
    "torch.nn.intrinsic.": "torch's own fused nn module class",
    "__torch__.": "TorchScript compiled class (resolved by the TorchScript loader, not imported)",
    "torch.jit._pickle.build_": "TorchScript list/tensor builder",
    "torch.jit._pickle.restore_type_tag": "TorchScript type tag",
    "torch.distributed.checkpoint.metadata.": "torch.distributed.checkpoint metadata dataclass",
    "torch.distributed.checkpoint.filesystem._StorageInfo": "torch.distributed.checkpoint storage record",
    "torch.distributed.checkpoint.planner.": "torch.distributed.checkpoint planner dataclass",
    "torch.distributed.checkpoint.default_planner.": "torch.distributed.checkpoint planner dataclass",
    "torch.distributed._shard.metadata.": "torch.distributed sharding metadata",
    "torch.distributed._shard.sharded_tensor.metadata.": "torch.distributed sharding metadata",
    "torch.distributed._shard.sharding_spec.": "torch.distributed sharding metadata",
    "torch.distributed.tensor.placement_types.": "DTensor placement dataclass",
    "torch.distributed.tensor._dtensor_spec.": "DTensor spec dataclass",
    "torch.storage.": "torch storage class",
    "torch.serialization.StorageType": "torch storage type",
    "torch.layout": "torch layout",
    "torch.memory_format": "torch memory format",
    "torch.contiguous_format": "torch memory format",
    "torch.channels_last": "torch memory format",
    "torch.preserve_format": "torch memory format",
    "torch.strided": "torch layout",
    "torch.sparse_coo": "torch layout",
    "torch.sparse_csr": "torch layout",
    "torch.sparse_csc": "torch layout",
    "torch.sparse_bsr": "torch layout",
    "torch.sparse_bsc": "torch layout",
    "torch.finfo": "torch dtype info",
    "torch.iinfo": "torch dtype info",
    "torch.dtype": "torch dtype class",
    "torch.float": "torch dtype alias",
    "torch.double": "torch dtype alias",
    "torch.half": "torch dtype alias",
    "torch.long": "torch dtype alias",
    "torch.int": "torch dtype alias",
    "torch.short": "torch dtype alias",
    "torch.cfloat": "torch dtype alias",
    "torch.cdouble": "torch dtype alias",
    "torch.chalf": "torch dtype alias",
    "torch.optim.": "torch optimizer class",
    "pathlib.PosixPath": "path value (constructing it touches no file)",
    "pathlib.PurePosixPath": "path value (constructing it touches no file)",
    "pathlib.WindowsPath": "path value (constructing it touches no file)",
    "pathlib.PureWindowsPath": "path value (constructing it touches no file)",
    "pathlib.Path": "path value (constructing it touches no file)",
    "numpy.random._pickle.": "NumPy random generator state",
    "numpy.random.bit_generator.": "NumPy random generator state",
    "numpy.core.numeric._frombuffer": "NumPy array from bytes",
    "numpy._core.numeric._frombuffer": "NumPy array from bytes",
    "numpy.ma.core._mareconstruct": "NumPy masked array",
    # torch.Generator pickles as torch._C.Generator(device) + BUILD: __setstate__ is set_state()
    # of the saved ByteTensor (torch/csrc/Generator.cpp); nothing of the file's choosing runs.
    "torch._C.Generator": "torch's random generator (__setstate__ restores its byte state)",
    "torch.Generator": "torch's random generator (__setstate__ restores its byte state)",
    # NumPy's bit generators and Generator/RandomState (numpy/random/_pickle.py and the Cython
    # classes' __setstate__): a state dict of integers, nothing else.
    "numpy.random._pcg64.": "NumPy random bit generator (state of integers)",
    "numpy.random._mt19937.": "NumPy random bit generator (state of integers)",
    "numpy.random._philox.": "NumPy random bit generator (state of integers)",
    "numpy.random._sfc64.": "NumPy random bit generator (state of integers)",
    "numpy.random._generator.": "NumPy random Generator (state of integers)",
    "numpy.random.mtrand.": "NumPy RandomState (state of integers)",
    "types.SimpleNamespace": "a bag of attributes (BUILD fills it; no code runs)",
    # ndarray subclasses that _reconstruct builds and ndarray.__setstate__ fills (numpy/_core)
    "numpy.matrixlib.defmatrix.matrix": "NumPy matrix (an ndarray subclass rebuilt from bytes)",
    "numpy.matrix": "NumPy matrix (an ndarray subclass rebuilt from bytes)",
    "numpy.recarray": "NumPy record array (an ndarray subclass rebuilt from bytes)",
    "numpy.rec.recarray": "NumPy record array (an ndarray subclass rebuilt from bytes)",
    "numpy.core.records.recarray": "NumPy record array (an ndarray subclass rebuilt from bytes)",
    "numpy._core.records.recarray": "NumPy record array (an ndarray subclass rebuilt from bytes)",
    "numpy.core.records.record": "NumPy record scalar", "numpy._core.records.record": "NumPy record scalar",
    "numpy.ma.core.MaskedArray": "NumPy masked array (an ndarray subclass rebuilt from bytes)",
    # protocols 0/1 save an instance as copyreg._reconstructor(cls, object, None): ``object`` is
    # the base whose __new__ copyreg calls (the dotted object.__new__ stays denied)
    "builtins.object": "the base class copyreg._reconstructor names (protocols 0 and 1)",
    # numpy < 1.17 pickled RandomState through this module-level constructor
    "numpy.random.__RandomState_ctor": "NumPy RandomState (numpy < 1.17; state of integers)",
    "numpy.random.mtrand.__RandomState_ctor": "NumPy RandomState (numpy < 1.17; state of integers)",
    # Exact names carved out of the denylist's "joblib" entry (see _DENY_EXCEPTIONS).
    "joblib.numpy_pickle.NumpyArrayWrapper": JOBLIB_WRAPPER_REASON,
    "sklearn.externals.joblib.numpy_pickle.NumpyArrayWrapper": JOBLIB_WRAPPER_REASON,
}
# Exact names inside a denied module that are data classes of that library (INFO): joblib's
# array placeholder. joblib.load itself, NDArrayWrapper (np.load(allow_pickle=True) of a file the
# pickle names) and the rest of joblib stay denied.
_DENY_EXCEPTIONS = frozenset({"joblib.numpy_pickle.NumpyArrayWrapper",
                              "sklearn.externals.joblib.numpy_pickle.NumpyArrayWrapper",
                              # torch._C is denied; its Generator class is torch's RNG state
                              "torch._C.Generator"})
# Lower-case functions under a framework prefix that are that framework's own reconstructors (a
# prefix covers classes only: ``torch.optim.lr_scheduler.partial`` is functools.partial).
_INERT_FUNCTIONS = frozenset({
    "numpy.random._pickle.__generator_ctor", "numpy.random._pickle.__bit_generator_ctor",
    "numpy.random._pickle.__randomstate_ctor", "numpy.random._pickle.__legacy_seeding",
})
# Exact framework names must match whole: "torch.float" must not cover "torch.float_power".
_FRAMEWORK_EXACT = {k for k in FRAMEWORK_PREFIXES if not k.endswith(".")}

# --- 2. denylist ----------------------------------------------------------------------------------
# Dotted prefix -> why it is dangerous. Sources: picklescan `_unsafe_globals` and its advisories
# (github.com/mmaitre314/picklescan/security), modelscan `settings.py`, fickling `UNSAFE_IMPORTS`,
# the JFrog (CVE-2025-10155/6/7), Sonatype (CVE-2025-1716/1889/1944/1945) and ReversingLabs
# (nullifAI) write-ups, and the Python docs for each module.
DENYLIST: dict[str, str] = {
    # code execution / evaluation
    "builtins.eval": "evaluates a Python expression",
    "builtins.exec": "executes Python code",
    "builtins.execfile": "executes a Python file",
    "builtins.compile": "compiles Python code",
    "builtins.__import__": "imports an arbitrary module",
    "builtins.open": "opens a file",
    "builtins.file": "opens a file",
    "builtins.breakpoint": "starts a debugger",
    "builtins.input": "reads from the terminal (stalls loaders)",
    "builtins.getattr": "reaches any attribute of any object (os.system from os)",
    "builtins.setattr": "rewrites attributes of any object",
    "builtins.delattr": "deletes attributes of any object",
    "builtins.globals": "exposes the interpreter's globals",
    "builtins.locals": "exposes the interpreter's locals",
    "builtins.vars": "exposes an object's namespace",
    "builtins.apply": "calls any callable (Python 2)",
    "builtins.memoryview": "raw memory access",
    "builtins.type": "creates classes dynamically (type('X', bases, {'__reduce__': ...}))",
    "builtins.object.__new__": "bypasses constructors",
    "builtins.super": "attribute resolution tricks",
    "builtins.help": "starts an interactive pager (spawns a process)",
    "builtins.exit": "exits the interpreter",
    "builtins.quit": "exits the interpreter",
    "builtins.copyright": "interactive site helper",
    "os": "operating system access: os.system, os.popen, os.exec*, file writes",
    "posix": "alias of os on Linux (posix.system)",
    "nt": "alias of os on Windows (nt.system)",
    "subprocess": "spawns processes",
    "_posixsubprocess": "spawns processes (fork_exec)",
    "_winapi": "Windows process creation",
    "pty": "pty.spawn runs commands",
    "commands": "Python 2 subprocess",
    "popen2": "Python 2 subprocess",
    "runpy": "runs modules and code (runpy._run_code)",
    "code": "interactive interpreter: runs code",
    "codeop": "compiles code",
    "importlib": "imports arbitrary modules (importlib.import_module('os').system)",
    "imp": "imports arbitrary modules",
    "zipimport": "imports modules from archives",
    "pkgutil": "pkgutil.resolve_name reaches any attribute of any module (GHSA-vvpj-8cmc-gx39)",
    "pydoc": "pydoc.locate imports modules; pydoc.pipepager runs commands",
    "sys": "interpreter state (sys.modules, settrace, setprofile)",
    "operator.attrgetter": "attribute access gadget (attrgetter('system')(os))",
    "operator.itemgetter": "item access gadget",
    "operator.methodcaller": "calls any method by name (methodcaller('system', cmd))",
    "functools.partial": "binds arguments to any callable (partial(os.system, cmd))",
    "functools.reduce": "calls any callable repeatedly",
    "functools.singledispatch": "wraps callables",
    "functools.cached_property": "wraps callables",
    "shutil": "copies, moves and deletes files; shutil.rmtree",
    "socket": "network access",
    "_socket": "network access",
    "ssl": "network access (ssl.get_server_certificate exfiltrates by DNS)",
    "http": "network access",
    "httplib": "network access (Python 2)",
    "urllib": "network access",
    "urllib2": "network access (Python 2)",
    "requests": "network access",
    "aiohttp": "network access",
    "httpx": "network access",
    "ftplib": "network access",
    "smtplib": "network access",
    "poplib": "network access",
    "imaplib": "network access; IMAP4_stream runs a command",
    "telnetlib": "network access",
    "nntplib": "network access",
    "xmlrpc": "remote procedure calls",
    "socketserver": "network servers",
    "webbrowser": "opens URLs (runs a browser process)",
    "ctypes": "loads native libraries and calls C functions",
    "_ctypes": "loads native libraries and calls C functions",
    "cffi": "loads native libraries",
    "multiprocessing": "spawns processes",
    "concurrent": "spawns workers",
    "asyncio": "asyncio.unix_events starts subprocesses (CVE-2025-10157 sub-module bypass)",
    "threading": "starts threads running any callable",
    "_thread": "starts threads running any callable",
    "signal": "installs signal handlers",
    "_signal": "installs signal handlers",
    "pickle": "loads a second pickle",
    "_pickle": "loads a second pickle (C accelerator of pickle)",
    "cPickle": "loads a second pickle (Python 2)",
    "pickletools": "pickle tooling",
    "dill": "loads pickles that carry code",
    "cloudpickle": "rebuilds functions from code objects",
    "joblib": "joblib.load loads a second pickle",
    "marshal": "loads code objects",
    "shelve": "opens pickle databases",
    "dbm": "opens databases",
    "copyreg.add_extension": "rewires pickle's extension registry",
    "copyreg.pickle": "registers reducers",
    # the registries themselves: a SETITEM into _inverted_registry / _extension_cache makes a later
    # EXT1/2/4 opcode import any name (or return any object) with no GLOBAL in the file
    "copyreg._inverted_registry": "rewires pickle's extension registry (EXT then imports any name)",
    "copyreg._extension_registry": "rewires pickle's extension registry (EXT then imports any name)",
    "copyreg._extension_cache": "rewires pickle's extension registry (EXT then returns any object)",
    "copyreg.remove_extension": "rewires pickle's extension registry",
    "copyreg.dispatch_table": "registers reducers",
    "types.CodeType": "builds code objects",
    "types.FunctionType": "builds functions from code objects",
    "types.LambdaType": "builds functions from code objects",
    "types.MethodType": "binds callables",
    "types.ModuleType": "creates modules",
    "pdb": "debugger: runs code",
    "bdb": "debugger: runs code",
    "trace": "runs code under tracing",
    "profile": "runs code (profile.run)",
    "cProfile": "runs code (cProfile.run)",
    "timeit": "runs code (timeit.timeit)",
    "doctest": "runs code (doctest.debug_script)",
    "idlelib": "IDLE: runs code",
    "antigravity": "importing it opens a web browser (webbrowser.open runs a browser process)",
    "turtle": "opens Tk windows (Tcl, which runs commands)",
    "turtledemo": "runs demo scripts on import (turtledemo.__main__)",
    "lib2to3": "lib2to3 grammar loads pickles",
    "distutils": "build tooling: writes files, spawns compilers",
    "setuptools": "build tooling: runs setup code",
    "pip": "installs packages (pip.main)",
    "_pyrepl": "runs commands through pagers",
    "venv": "creates environments (runs pip)",
    "ensurepip": "runs pip (ensurepip._run_pip)",
    "tempfile": "creates files",
    "glob": "lists the file system",
    "fileinput": "reads files",
    "io.open": "opens a file",
    "io.FileIO": "opens a file",
    "io.open_code": "opens a file",
    "_io": "opens files (_io.FileIO)",
    "pathlib.Path.write_text": "writes a file",
    "pathlib.Path.write_bytes": "writes a file",
    "pathlib.Path.read_text": "reads a file",
    "pathlib.Path.read_bytes": "reads a file",
    "pathlib.Path.open": "opens a file",
    "pathlib.Path.unlink": "deletes a file",
    "pathlib.Path.rmdir": "deletes a folder",
    "pathlib.Path.mkdir": "creates a folder",
    "pathlib.Path.touch": "creates a file",
    "pathlib.Path.rename": "moves a file",
    "pathlib.Path.replace": "moves a file",
    "pathlib.Path.symlink_to": "creates a link",
    "pathlib.Path.hardlink_to": "creates a link",
    "pathlib.Path.chmod": "changes permissions",
    "pathlib.PosixPath.write_text": "writes a file",
    "pathlib.PosixPath.write_bytes": "writes a file",
    "pathlib.PosixPath.open": "opens a file",
    "pathlib.PosixPath.unlink": "deletes a file",
    "logging.config": "logging.config.listen runs a config server that evaluates code",
    "logging.FileHandler": "creates files",
    "mailcap": "mailcap.findmatch runs a command",
    "uuid._get_command_stdout": "runs a command",
    "_osx_support": "runs commands",
    "_aix_support": "runs commands",
    "platform._syscmd_file": "runs a command",
    "platform.popen": "runs a command",
    "test": "CPython test helpers spawn interpreters (test.support.script_helper)",
    "numpy.testing._private.utils.runstring": "numpy's exec wrapper",
    "numpy.testing": "numpy.testing runstring is exec",
    "numpy.f2py": "numpy.f2py evaluates strings",
    "numpy.distutils": "build tooling",
    "numpy.load": "loads a second file (allow_pickle)",
    "numpy.lib.npyio": "loads a second file (allow_pickle)",
    "numpy.lib.format.read_array": "loads pickled arrays",
    "numpy.ctypeslib": "loads native libraries",
    "numpy.core._internal._ctypes": "raw memory",
    "pandas.read_pickle": "loads a second pickle",
    "pandas.io.pickle": "loads a second pickle",
    "typing._eval_type": "evaluates strings",
    "typing.ForwardRef._evaluate": "evaluates strings",
    "torch.load": "loads a second checkpoint",
    "torch.serialization.load": "loads a second checkpoint",
    "torch.serialization._load": "loads a second checkpoint",
    "torch.serialization._legacy_load": "loads a second checkpoint",
    "torch.storage._load_from_bytes": "loads a second checkpoint from bytes",
    "torch.hub": "downloads and runs code (torch.hub.load)",
    "torch.jit.load": "loads TorchScript",
    "torch.jit._serialization": "loads TorchScript",
    "torch.jit.unsupported_tensor_ops": "execWrapper runs code",
    "torch.jit.frontend": "compiles source",
    "torch.jit._script": "compiles source",
    "torch.jit.CompilationUnit": "compiles source",
    "torch._C": "native torch internals (torch._C._jit_*)",
    "torch._dynamo": "compiler: generates and runs code",
    "torch._inductor": "compiler: generates, compiles and runs code (codecache.compile_file)",
    "torch._export": "compiles graphs",
    "torch.export": "compiles graphs",
    "torch.compile": "compiles code",
    "torch.fx": "graph codegen runs generated code",
    "torch.package": "torch.package imports code from archives",
    "torch.utils.cpp_extension": "compiles and loads native extensions",
    "torch.utils._config_module": "ConfigModule.load_config loads a pickle",
    "torch.utils.bottleneck": "runs scripts",
    "torch.utils.collect_env": "runs commands",
    "torch.utils.data.datapipes.utils.decoder": "basichandlers unpickles data",
    "torch.utils.benchmark": "compiles and runs code",
    "torch.distributed.rpc": "remote procedure calls",
    "torch.distributed.elastic": "spawns processes",
    "torch.multiprocessing": "spawns processes",
    "torch.ops.load_library": "loads native libraries",
    "torch.classes.load_library": "loads native libraries",
    "torch._ops": "loads native operator libraries",
    "torch.library": "registers native operators",
    "keras": "Keras Lambda layers run code",
    "tensorflow": "TensorFlow ops read and write files",
    "yaml.load": "yaml.load builds arbitrary objects",
    "yaml.unsafe_load": "builds arbitrary objects",
    "jinja2": "templates run code",
    "sqlite3": "opens databases",
    "gc": "reaches every live object",
    "inspect": "reaches frames and code",
    "site": "alters import paths",
    "sysconfig": "interpreter configuration",
    "builtins.__loader__": "imports modules",
    "builtins.__builtins__": "the builtins namespace",
    # --- found by the bypass hunt (every entry below was reported at most HIGH before) ---------
    # gadgets that call any callable they are given (like functools.reduce / partial)
    "builtins.map": "calls any callable over an iterable (a gadget like functools.reduce)",
    "builtins.filter": "calls any callable over an iterable (a gadget like functools.reduce)",
    "itertools.starmap": "calls any callable with arguments from the pickle",
    "itertools.accumulate": "calls any callable repeatedly",
    "itertools.filterfalse": "calls any callable over an iterable",
    "itertools.takewhile": "calls any callable over an iterable",
    "itertools.dropwhile": "calls any callable over an iterable",
    "itertools.groupby": "calls any callable over an iterable",
    "operator.call": "calls any callable (operator.call, Python 3.11+)",
    "atexit": "registers a callable to run at interpreter exit",
    "weakref.finalize": "registers a callable to run when an object dies",
    "sched": "runs scheduled callables",
    "contextlib.ExitStack": "runs registered callbacks",
    "numpy.frompyfunc": "wraps any callable as a ufunc (calls it on every element)",
    "numpy.vectorize": "wraps any callable (calls it on every element)",
    # class factories (the builtins.type trick through other doors)
    "types.new_class": "creates classes dynamically",
    "abc.ABCMeta": "creates classes dynamically",
    "dataclasses._create_fn": "exec()s generated source",
    "dataclasses._FuncBuilder": "exec()s generated source",
    "unittest": "unittest.main / TestLoader.discover import modules from paths; mock._importer imports any module",
    "rlcompleter": "Completer.complete eval()s the text it completes",
    "tkinter": "Tcl().eval runs Tcl, which runs commands (exec)",
    "_tkinter": "Tcl interpreter: runs commands",
    "turtle": "opens a Tk window (tkinter)",
    "_imp": "creates modules from native libraries (_imp.create_dynamic)",
    "_frozen_importlib": "the import machinery: imports any module",
    "_frozen_importlib_external": "the import machinery: loads source and native files",
    "torch._jit_internal": "createResolutionCallback* resolve names in caller frames",
    "torch._sources": "parses source for compilation",
    "torch._weights_only_unpickler": "a second unpickler",
    "torch.serialization.add_safe_globals": "widens torch.load's weights-only allowlist for later loads",
    "torch.serialization.safe_globals": "widens torch.load's weights-only allowlist",
    "torch.jit.script": "compiles code",
    "torch.jit.trace": "compiles code",
    "torch.jit._trace": "compiles code",
    "torch.utils.data.dataloader": "DataLoader workers spawn processes",
    "torch.utils.hipify": "rewrites source files",
    "torch.utils.tensorboard": "writes event files",
    "torch.distributed.run": "spawns processes (torchrun)",
    "torch.distributed.launch": "spawns processes",
    "torch.testing._internal.common_utils": "test helpers spawn processes and run code",
    "torch.testing._internal.common_distributed": "test helpers spawn processes",
    "torch.testing._internal.distributed": "test helpers spawn processes",
    "torch.profiler": "writes trace files",
    "torch.utils.model_zoo": "downloads a checkpoint and torch.loads it (load_url)",
    "torch.utils.show_pickle": "DumpUnpickler reads pickles",
    "torch.utils._content_store": "ContentStoreReader torch.loads files",
    "torch.utils.file_baton": "creates files",
    "torch.utils.data.datapipes": "FileOpener/FileLister read files; decoders unpickle",
    "torch.utils.jit": "log_extract runs graphs from logs",
    "torch.onnx": "export writes files and runs the model",
    "torch.distributed.checkpoint.state_dict_loader": "loads checkpoints from paths",
    "torch.distributed.checkpoint.state_dict_saver": "writes checkpoints to paths",
    "torch.distributed.checkpoint.filesystem.FileSystemReader": "reads files from a path",
    "torch.distributed.checkpoint.filesystem.FileSystemWriter": "writes files to a path",
    "torch.distributed.TCPStore": "network access",
    "torch.distributed.FileStore": "creates files",
    "torch.distributed.distributed_c10d": "init_process_group opens network connections",
    "torch.distributed.launcher": "spawns processes",
    "torch._library": "registers native operators",
    "torch.cuda.memory._dump_snapshot": "writes a file",
    "torch.cuda.memory._record_memory_history": "writes a file",
    "torch.cuda.memory._save_segment_usage": "writes a file",
    "torch.cuda.memory._save_memory_usage": "writes a file",
    "torch.autograd.graph.register_multi_grad_hook": "registers a callable run on backward",
    "torch.autograd.graph.saved_tensors_hooks": "registers callables",
    "torch.nn.modules.module.register_module_forward_hook": "a process-wide hook: runs a callable on every forward",
    "torch.nn.modules.module.register_module_forward_pre_hook": "a process-wide hook: runs a callable on every forward",
    "torch.nn.modules.module.register_module_full_backward_hook": "a process-wide hook: runs a callable on every backward",
    "torch.nn.modules.module.register_module_full_backward_pre_hook": "a process-wide hook",
    "torch.nn.modules.module.register_module_backward_hook": "a process-wide hook",
    "torch.nn.modules.module.register_module_module_registration_hook": "a process-wide hook",
    "torch.nn.modules.module.register_module_parameter_registration_hook": "a process-wide hook",
    "torch.nn.modules.module.register_module_buffer_registration_hook": "a process-wide hook",
    "torch.autograd.profiler": "writes trace files",
    # file writes and reads through torch / numpy / pandas
    "torch.save": "writes a file",
    "torch.from_file": "maps a file (shared=True writes it)",
    "torch.storage.UntypedStorage.from_file": "maps a file (shared=True writes it)",
    "torch.storage.TypedStorage.from_file": "maps a file (shared=True writes it)",
    "torch.UntypedStorage.from_file": "maps a file (shared=True writes it)",
    "torch.TypedStorage.from_file": "maps a file (shared=True writes it)",
    "torch.serialization.save": "writes a file",
    "torch.serialization._save": "writes a file",
    "torch.serialization._legacy_save": "writes a file",
    "numpy.save": "writes a file",
    "numpy.savez": "writes a file",
    "numpy.savez_compressed": "writes a file",
    "numpy.savetxt": "writes a file",
    "numpy.memmap": "maps a file (mode w+ creates or truncates it)",
    "numpy.fromfile": "reads a file",
    "numpy.ndarray.tofile": "writes a file",
    "numpy.ndarray.dump": "writes a pickle file",
    "numpy.loadtxt": "reads a file",
    "numpy.genfromtxt": "reads a file",
    "numpy.fromregex": "reads a file",
    "numpy.DataSource": "opens files and URLs",
    "numpy.lib._datasource": "opens files and URLs",
    "numpy.lib._npyio_impl": "numpy 2's np.load: loads a second file (allow_pickle)",
    "numpy.lib.format": "read_array unpickles object arrays; open_memmap creates files",
    "numpy.lib._format_impl": "numpy 2's read_array unpickles object arrays; open_memmap creates files",
    "numpy.ma.core.load": "pickle.load of a file",
    "numpy.ma.core.loads": "pickle.loads",
    "numpy.ma.load": "pickle.load of a file",
    "numpy.ma.loads": "pickle.loads",
    "numpy.ma.core.dump": "writes a pickle file",
    "numpy.ma.dump": "writes a pickle file",
    "pandas.eval": "evaluates expressions",
    "pandas.core.computation": "evaluates expressions (pandas.eval, DataFrame.query)",
    "pandas.io": "reads and writes files and URLs",
    **{f"pandas.read_{n}": "reads files and URLs" for n in (
        "csv table fwf excel json html xml sql sql_query sql_table parquet feather orc hdf stata "
        "sas spss clipboard gbq").split()},
    # the standard library's other file, archive and process doors
    "logging.handlers": "handlers open sockets and files",
    "logging.basicConfig": "creates a log file (filename=)",
    "zipfile": "ZipFile(path, 'w') truncates a file; extractall writes anywhere",
    "tarfile": "extractall writes anywhere (path traversal)",
    "linecache": "reads files",
    "codecs.open": "opens a file",
    "bz2.open": "opens a file", "bz2.BZ2File": "opens a file",
    "gzip.open": "opens a file", "gzip.GzipFile": "opens a file",
    "lzma.open": "opens a file", "lzma.LZMAFile": "opens a file",
    "mailbox": "opens and writes mailboxes",
    "wave.open": "opens a file",
    "filecmp": "reads files",
    "netrc": "reads credential files",
    "mmap": "maps files and memory",
    "fcntl": "controls file descriptors",
    "termios": "controls the terminal",
    "readline": "reads and writes history files",
    "cgitb": "writes tracebacks to files",
    "winreg": "Windows registry access",
    "_winreg": "Windows registry access (Python 2)",
    "getpass": "reads from the terminal (stalls loaders)",
    "multiprocess": "dill's multiprocessing fork: spawns processes",
    "pickle5": "loads a second pickle (the pickle protocol 5 backport)",
    "pathos": "spawns processes (multiprocess, dill)",
    # third-party wrappers around commands and eval (a model's environment often has them)
    "IPython": "runs shell commands and code (IPython.utils.process.system, get_ipython)",
    "invoke": "runs shell commands (invoke.run)",
    "fabric": "runs remote and local commands",
    "sh": "runs shell commands (sh.Command)",
    "plumbum": "runs shell commands",
    "paramiko": "SSH: runs remote commands",
    "pexpect": "spawns processes",
    "ptyprocess": "spawns processes",
    "sympy.sympify": "eval()s strings",
    "sympy.core.sympify": "eval()s strings",
    "sympy.parsing": "eval()s strings (parse_expr)",
    "numexpr": "evaluates expressions",
    "mako": "templates run code",
    "Cython": "compiles and runs code (Cython.inline)",
    "pyximport": "compiles and imports code",
    "docker": "runs containers",
    "dask.distributed": "remote code execution on workers",
    "distributed": "remote code execution on workers",
}

# --- 2b. code-running, as data ----------------------------------------------------------------------
# The standard library's own: derived from its source by tools/derive_stdlib_gadgets.py (an ast
# call graph from every stdlib function, class and method to eval/exec/__import__/importlib,
# processes, ctypes, pickle/marshal loads, open-for-write, sockets), with the path per entry.
# Third-party ones: a reviewed hand list with a reason and a source per entry.
_DATA_DIR = os.path.join(os.path.dirname(__file__), "policy_data")


def _load_data(name: str) -> dict:
    with open(os.path.join(_DATA_DIR, name), encoding="utf-8") as f:
        return json.load(f)


_STDLIB = _load_data("stdlib_code_running.json")
STDLIB_PROVENANCE: dict = _STDLIB["provenance"]
STDLIB_CODE_RUNNING: dict[str, str] = {
    k: f"{v['does']} (derived from the standard library's source: {v['path']})"
    for k, v in _STDLIB["entries"].items()}
# Reached only through compile(): builds code objects, runs none (typing's special forms make a
# ForwardRef, which compiles its string). Not code-running; judged as unknown.
STDLIB_COMPILE_ONLY: dict[str, str] = dict(_STDLIB["compile_only"])
THIRD_PARTY_CODE_RUNNING: dict[str, str] = {
    k: v["reason"] for k, v in _load_data("third_party_code_running.json")["entries"].items()}
del _STDLIB

# Final names of call gadgets that modules re-export (``from functools import partial`` in
# torch.optim.lr_scheduler makes ``torch.optim.lr_scheduler.partial`` functools.partial).
_REEXPORTED_GADGETS: dict[str, str] = {
    "partial": "functools.partial", "reduce": "functools.reduce",
    "methodcaller": "operator.methodcaller", "attrgetter": "operator.attrgetter",
    "starmap": "itertools.starmap", "get_type_hints": "typing.get_type_hints",
    "import_module": "importlib.import_module", "namedtuple": "collections.namedtuple",
    "resolve_name": "pkgutil.resolve_name", "locate": "pydoc.locate", "getattr": "builtins.getattr",
    "run_path": "runpy.run_path", "run_module": "runpy.run_module",
}


def _deny_hit(dotted: str) -> tuple[str, str] | None:
    """(entry, reason) when ``dotted`` (or a dotted prefix of it) is code-running in any table."""
    for table in (DENYLIST, THIRD_PARTY_CODE_RUNNING, STDLIB_CODE_RUNNING):
        hit = matches(dotted, table)
        if hit is not None:
            return hit, table[hit]
    return None


# --- 3b. libraries whose unknown classes are "review", not user code ------------------------------
# Top-level package -> the family a finding names. A global of these that is neither code-running
# nor known inert is library code (an Enum member of transformers' TrainingArguments, a pandas
# dtype, a scikit-learn estimator): loading runs that library's constructors and __setstate__,
# nothing the file wrote, but a weights-only load refuses it. MEDIUM at most, never user code.
KNOWN_LIBRARIES: dict[str, str] = {
    "torch": "PyTorch", "torchvision": "torchvision", "torchaudio": "torchaudio",
    "numpy": "NumPy", "scipy": "SciPy", "pandas": "pandas", "sklearn": "scikit-learn",
    "transformers": "Hugging Face transformers", "accelerate": "Hugging Face accelerate",
    "peft": "Hugging Face peft", "tokenizers": "Hugging Face tokenizers",
    "datasets": "Hugging Face datasets", "diffusers": "Hugging Face diffusers",
    "huggingface_hub": "Hugging Face hub client", "safetensors": "safetensors",
    "sentence_transformers": "sentence-transformers", "timm": "timm",
    "lightning": "Lightning", "pytorch_lightning": "Lightning", "lightning_fabric": "Lightning",
    "torchmetrics": "torchmetrics", "omegaconf": "OmegaConf", "xgboost": "XGBoost",
    "lightgbm": "LightGBM", "catboost": "CatBoost", "skops": "skops", "onnx": "ONNX",
    "ml_dtypes": "ml_dtypes", "joblib": "joblib", "packaging": "packaging",
}


def library_of(dotted: str) -> str | None:
    """The family of a known library (or "the Python standard library") that ``dotted`` belongs
    to, None for anything else (user code, unknown packages)."""
    import sys
    root = dotted.split(".", 1)[0]
    if root in KNOWN_LIBRARIES:
        return KNOWN_LIBRARIES[root]
    if root in sys.stdlib_module_names and root != "__main__" or root in ("__builtin__", "copy_reg"):
        return "the Python standard library"
    return None


# Calls that hand bytes to a deserializer: the bytes are a second stage, scanned recursively.
LOADER_CALLS: frozenset[str] = frozenset({
    "pickle.loads", "pickle.load", "pickle.Unpickler", "pickle._loads", "pickle._load",
    "pickle._Unpickler", "dill.loads", "dill.load", "dill._dill.loads", "cloudpickle.loads",
    "joblib.load", "marshal.loads", "marshal.load", "torch.load", "torch.serialization.load",
    "torch.storage._load_from_bytes", "numpy.load", "numpy.loads", "pandas.read_pickle",
    "torch.utils._config_module.ConfigModule.load_config", "shelve.open",
})

# Calls that only wrap or convert bytes: their argument is what a loader would read.
BYTES_WRAPPERS: frozenset[str] = frozenset({
    "_codecs.encode", "codecs.encode", "codecs.decode", "io.BytesIO", "_io.BytesIO",
    "builtins.bytes", "builtins.bytearray", "base64.b64decode", "base64.decodebytes",
    "base64.b85decode", "base64.a85decode", "base64.b32decode", "base64.standard_b64decode",
    "base64.urlsafe_b64decode", "binascii.a2b_base64", "binascii.unhexlify", "binascii.a2b_hex",
    "zlib.decompress", "gzip.decompress", "bz2.decompress", "lzma.decompress",
    "builtins.memoryview",
})

# TorchScript code/ files: calls to these prefixes are the compiler's own vocabulary.
TORCHSCRIPT_CALL_PREFIXES: tuple[str, ...] = (
    "torch.", "ops.", "__torch__.", "annotate", "uninitialized", "unchecked_cast", "isinstance",
    "getattr", "hasattr", "len", "int", "float", "bool", "str", "range", "enumerate", "zip",
    "min", "max", "abs", "round", "print", "list", "dict", "tuple", "append", "insert",
    "extend", "pop", "keys", "values", "items", "format", "join", "split", "strip", "startswith",
    "endswith", "sorted", "sum", "divmod", "chr", "ord", "hash", "id", "contiguous",
    "CONSTANTS.", "self.", "_", "math.", "warnings.warn", "__is__", "__isnot__", "__not__",
    "__contains__", "__getitem__", "__setitem__", "__derive_index", "__range_length",
    "RuntimeError", "AssertionError", "ValueError", "Exception", "NotImplementedError",
    "IndexError", "KeyError", "TypeError", "fork", "wait", "_unwrap_optional", "interface",
)
# Names that the TorchScript code vocabulary may still not reach: a call to any of these in code/
# is the strongest signal.
TORCHSCRIPT_DANGEROUS = ("torch.ops.load_library", "torch.classes.load_library", "os.", "sys.",
                         "subprocess.", "builtins.", "eval", "exec", "open", "__import__")

# ONNX operator domains that need no custom-op library (onnx/defs, onnxruntime contrib ops).
STANDARD_ONNX_DOMAINS: frozenset[str] = frozenset({
    "", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training",
    "com.microsoft", "com.microsoft.nchwc", "com.microsoft.experimental",
    "org.pytorch.aten", "com.ms.internal.nhwc", "pkg.onnxscript.torch_lib",
    "pkg.onnxscript.torch_lib.common", "pkg.torch.onnx",
})

# Accelerator and alias modules, folded onto the module they implement.
_MODULE_ALIASES: dict[str, str] = {
    "__builtin__": "builtins", "__builtins__": "builtins", "copy_reg": "copyreg",
    "_operator": "operator", "_functools": "functools", "_pickle": "pickle", "cPickle": "pickle",
    "_io": "io", "_codecs": "_codecs", "_collections": "collections", "_socket": "socket",
    "_thread": "threading", "thread": "threading",
    "_signal": "signal", "_ctypes": "ctypes", "_posixsubprocess": "subprocess",
    "numpy.core": "numpy._core",
}


# Dunder names that pickles made by the standard library name themselves.
_SAFE_DUNDERS = frozenset({"copyreg.__newobj__", "copyreg.__newobj_ex__"})


def _dunder_step(name: str) -> str | None:
    """The first ``__x__`` component of a global's attribute path (``object.__getattribute__``,
    ``Module.__init__.__globals__``), None when there is none. CPython's ``find_class`` resolves a
    dotted name by ``getattr`` steps, refusing only ``<locals>``: a class's or a function's dunders
    are a way from an innocent-looking global to any object of the interpreter."""
    for part in name.split("."):
        if len(part) > 4 and part.startswith("__") and part.endswith("__"):
            return part
    return None


# Final names that only command and code runners carry (os, subprocess, commands, IPython...).
_RUNNER_NAMES = frozenset({
    "system", "popen", "popen2", "popen3", "popen4", "getoutput", "getstatusoutput",
    "check_output", "check_call", "exec_command", "run_command", "startfile", "execfile",
    "eval", "exec", "__import__", "import_module", "load_library", "LoadLibrary", "dlopen",
    "fork_exec", "forkpty"})

# Code-carrying picklers that other packages vendor (srsly.cloudpickle, ray.cloudpickle,
# pyspark.cloudpickle, joblib.externals.cloudpickle): any module path through one of them.
_CODE_PICKLERS = frozenset({"cloudpickle", "cloudpickle_fast", "dill", "_dill"})


def _walked_to(name: str) -> tuple[str, str] | None:
    """(denylist entry, attribute path) when a dotted name reaches a denied module through an
    attribute of the module it names: protocol 4 resolves ``torch.nn.modules.module`` +
    ``torch.load`` as ``getattr(getattr(module, 'torch'), 'load')``, i.e. torch.load, behind an
    allowlisted-looking prefix. Every tail of the attribute path is matched as a dotted name, also
    without the leading underscores of its first part (``collections._sys`` is ``sys``)."""
    if "." not in name:
        return None
    parts = name.split(".")
    for i in range(len(parts)):
        tail = ".".join(parts[i:])
        # modules import their dependencies under private names (collections._sys, random._os)
        bare = ".".join([parts[i].lstrip("_")] + parts[i + 1:])
        for cand in (*_candidates(tail, tail), bare):
            hit = _deny_hit(cand)
            if hit is not None:
                return hit, tail
    return None


def normalize(module: str, name: str) -> tuple[str, str]:
    """The (module, name) pair ``find_class`` would import for protocol < 3 (``_compat_pickle``),
    so ``__builtin__ eval`` and ``builtins eval`` judge alike."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    return module, name


def _candidates(dotted: str, module: str) -> list[str]:
    """The names one global is matched as: as written, normalised, and with each alias folded."""
    out = [dotted]
    for alias, real in _MODULE_ALIASES.items():
        if module == alias or module.startswith(alias + "."):
            out.append(real + dotted[len(alias):])
    return out


def matches(dotted: str, table) -> str | None:
    """The first table key that is ``dotted`` or a dotted prefix of it (at a name boundary)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in table:
            return key
    return None


@dataclass(frozen=True, slots=True)
class Verdict:
    """How the policy classes one global.

    Attributes:
        category: `ALLOWED`, `DENIED`, `FRAMEWORK` or `UNKNOWN`.
        dotted: the normalised full name (``builtins.eval`` for ``__builtin__ eval``).
        reason: one short clause saying why (the table's comment), "" for unknown names.
        entry: the table key that matched (``os`` for ``os.system``), None for unknown names.
    """

    category: str
    dotted: str
    reason: str = ""
    entry: str | None = None


def classify(module: str, name: str) -> Verdict:
    """Judge one global by its full dotted name.

    >>> classify("__builtin__", "eval").category
    'denied'
    >>> classify("torch._utils", "_rebuild_tensor_v2").category
    'allowed'
    >>> classify("asyncio.unix_events", "_UnixSubprocessTransport").entry
    'asyncio'
    >>> classify("__main__", "TinyNet").category
    'unknown'
    """
    if type(module) is str and type(name) is str:
        key = (module, name)
        hit = _VERDICTS.get(key)
        if hit is None:
            if len(_VERDICTS) >= _VERDICTS_MAX:  # hostile pickles name many globals: bounded
                _VERDICTS.clear()
            hit = _VERDICTS[key] = _classify(module, name)
        return hit
    return _classify(str(module), str(name))


# Verdicts are pure functions of (module, name): a checkpoint names the same few globals in
# every file of a folder, so they are memoised (bounded; Verdict is frozen and shared).
_VERDICTS: dict[tuple[str, str], Verdict] = {}
_VERDICTS_MAX = 8192


def _classify(module: str, name: str) -> Verdict:
    nmod, nname = normalize(module, name)
    dotted = f"{nmod}.{nname}" if nmod else nname
    raw = f"{module}.{name}" if module else name
    names = []
    for cand in dict.fromkeys([*_candidates(dotted, nmod), *_candidates(raw, module)]):
        names.append(cand)
    # A denylist hit anywhere wins (an allowlisted prefix must not shadow a dangerous suffix),
    # except for the few exact names carved out of a denied module.
    if dotted in _DENY_EXCEPTIONS or raw in _DENY_EXCEPTIONS:
        return Verdict(FRAMEWORK, dotted, FRAMEWORK_PREFIXES[dotted if dotted in
                                                              _DENY_EXCEPTIONS else raw], dotted)
    for cand in names:
        hit = _deny_hit(cand)
        if hit is not None:
            return Verdict(DENIED, dotted, hit[1], hit[0])
    if "__main__" in nmod.split(".")[1:]:
        # a package's __main__ is a script: many run their main() at import, unguarded
        # (tkinter.__main__, turtledemo.__main__); a top-level __main__ is the pickler's own
        # script (its classes are user code, judged as unknown)
        return Verdict(DENIED, dotted, "a package's __main__ module: importing it runs the "
                       "package as a script", nmod)
    vendored = next((p for p in nmod.split(".")[1:] if p in _CODE_PICKLERS), None)
    if vendored is not None:
        return Verdict(DENIED, dotted, f"a vendored copy of {vendored.lstrip('_')} (rebuilds "
                       "functions and classes from code objects)", f"{nmod}")
    walked = _walked_to(nname)
    if walked is not None:
        (hit, why), tail = walked
        return Verdict(DENIED, dotted, f"walks from {nmod} through attributes to {tail}: "
                       f"{why}", hit)
    verb = nname.rsplit(".", 1)[-1]
    canonical = _REEXPORTED_GADGETS.get(verb)
    if canonical is not None and dotted != canonical:
        return Verdict(DENIED, dotted, f"re-exports {canonical} under {nmod}: "
                       f"{_deny_hit(canonical)[1]}", canonical)
    if verb in _RUNNER_NAMES or verb.startswith(("spawn", "execv", "execl", "posix_spawn")):
        # a command runner re-exported under another module (``from os import system`` in a
        # package we do not list): its name is all the scan knows, and it says enough
        return Verdict(DENIED, dotted, f"named like a command or code runner ({verb}), "
                       "whatever module re-exports it", dotted)
    dunder = _dunder_step(nname) if not (set(names) & _SAFE_DUNDERS) else None
    if dunder is not None:
        return Verdict(DENIED, dotted, f"walks to its {dunder} attribute: dunders lead to "
                       "interpreter internals (a sandbox-escape gadget)",
                       f"{nmod}.{nname}" if nmod else nname)
    for cand in names:
        if cand in SAFE_GLOBALS or cand in TRANSPARENT_CONSTRUCTORS:
            return Verdict(ALLOWED, dotted, "needed by a weights-only load", cand)
        if cand.startswith(_NUMPY_DTYPE_PREFIX) and cand.count(".") == 2:
            return Verdict(ALLOWED, dotted, "NumPy dtype class", cand)
    if "." in nname and not nmod.startswith("__torch__"):
        # a method or attribute of a framework class (``Module.register_forward_hook``,
        # ``UntypedStorage.from_file``) is a callable of the file's choosing, not the class:
        # judged by use, like any unknown name
        return Verdict(UNKNOWN, dotted, "", None)
    for cand in names:
        for prefix, why in FRAMEWORK_PREFIXES.items():
            if prefix in _FRAMEWORK_EXACT:
                if cand == prefix or (prefix.endswith(("_", "build_")) and cand.startswith(prefix)):
                    return Verdict(FRAMEWORK, dotted, why, prefix)
            elif cand.startswith(prefix) and _is_class_name(cand):
                return Verdict(FRAMEWORK, dotted, why, prefix)
    return Verdict(UNKNOWN, dotted, "", None)


def _is_class_name(dotted: str) -> bool:
    """A prefix of FRAMEWORK_PREFIXES covers that framework's classes (``Linear``,
    ``_IncompatibleKeys``), Cython's per-class unpickle helpers and the listed reconstructors,
    never a module-level function (``torch.optim.lr_scheduler.partial`` is functools.partial)."""
    last = dotted.rsplit(".", 1)[-1]
    return last.lstrip("_")[:1].isupper() or last.startswith("__pyx_unpickle_") or \
        dotted in _INERT_FUNCTIONS
