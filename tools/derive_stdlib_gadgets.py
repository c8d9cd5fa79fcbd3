"""Derive the standard library's code-running callables from its own source (never from model files).

Every ``.py`` file of the running interpreter's standard library is parsed with ``ast`` (read, never
imported). Each module-level function, class and method becomes a node; a node's calls are resolved
through the module's imports (``import os`` + ``os.system(...)`` -> ``os.system``; ``from subprocess
import Popen``; ``self.m()`` -> the method ``m`` of the same class) to dotted names. A node is
*code-running* when it calls a sink -- something that evaluates a string, imports a module by name,
starts a process, loads native code or a second pickle/marshal payload, writes or deletes files, or
opens a socket -- directly or through other nodes (a fixed point over the whole standard library).

A class is code-running when what a loader or its caller runs on it reaches a sink: construction
(``__new__``/``__init__``), ``__setstate__`` (BUILD), ``__call__``, ``__del__`` and the protocol
dunders that ``str()``, ``dict()``, ``hash()`` and iteration call (``__repr__``, ``keys`` ...).
A method is judged on its own: protocol 4 imports ``pstats.Stats.load_stats`` by name.

Output: ``tensorscope/policy_data/stdlib_code_running.json`` with its provenance (Python version,
date, this script) and, per entry, the path that reaches the sink (``a -> b -> builtins.eval``).
The scanner reads that file (`tensorscope.policy`); ``tests/test_scan_policy_data.py`` re-runs this
derivation when the interpreter matches and checks the committed data is what it produces.

Usage: python tools/derive_stdlib_gadgets.py [--check]
"""
from __future__ import annotations

import ast
import datetime
import json
import os
import sys
import sysconfig

OUT = os.path.join(os.path.dirname(__file__), "..", "tensorscope", "policy_data",
                   "stdlib_code_running.json")

# --- sinks: (module, name) the derivation stops at, each with what it does -------------------------
_EXEC = {f"builtins.{n}": "evaluates or compiles Python code" for n in ("eval", "exec", "compile")}
_SINKS: dict[str, str] = {
    **_EXEC,
    "builtins.__import__": "imports a module by name",
    "builtins.breakpoint": "starts a debugger",
    "importlib.import_module": "imports a module by name",
    "importlib.__import__": "imports a module by name",
    "importlib._bootstrap._gcd_import": "imports a module by name",
    "importlib.util.spec_from_file_location": "imports a module from a path",
    "importlib.util.module_from_spec": "creates a module from a spec",
    "_imp.create_dynamic": "loads a native extension",
    "pickle.loads": "loads a pickle", "pickle.load": "loads a pickle",
    "pickle.Unpickler": "loads a pickle", "_pickle.loads": "loads a pickle",
    "_pickle.load": "loads a pickle", "_pickle.Unpickler": "loads a pickle",
    "marshal.loads": "loads code objects", "marshal.load": "loads code objects",
    "_posixsubprocess.fork_exec": "starts a process",
    "_winapi.CreateProcess": "starts a process",
    "socket.socket": "opens a socket", "_socket.socket": "opens a socket",
    "socket.create_connection": "opens a socket", "socket.create_server": "opens a socket",
    "socket.socketpair": "opens a socket", "socket.fromfd": "opens a socket",
    "_ctypes.dlopen": "loads a native library", "_ctypes.LoadLibrary": "loads a native library",
    "ctypes.CDLL": "loads a native library", "ctypes.PyDLL": "loads a native library",
    "ctypes.WinDLL": "loads a native library", "ctypes.OleDLL": "loads a native library",
    "ctypes.LibraryLoader": "loads native libraries",
    "ctypes.CFUNCTYPE": "calls raw function pointers", "ctypes.cast": "raw memory access",
    "ctypes.memmove": "raw memory access", "ctypes.string_at": "raw memory access",
    "_tkinter.create": "starts a Tcl interpreter (runs commands)",
}
# os/posix/nt functions that start processes, replace the process, or write the file system.
_OS_PROCESS = ("system", "popen", "fork", "forkpty", "startfile", "posix_spawn", "posix_spawnp")
_OS_PREFIXES = ("exec", "spawn")
_OS_WRITE = ("remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace", "truncate",
             "ftruncate", "symlink", "link", "chmod", "lchmod", "fchmod", "chown", "lchown",
             "fchown", "mkfifo", "mknod", "putenv", "unsetenv", "kill", "killpg")
for _m in ("os", "posix", "nt"):
    for _n in _OS_PROCESS:
        _SINKS[f"{_m}.{_n}"] = "starts a process"
    for _n in _OS_WRITE:
        _SINKS[f"{_m}.{_n}"] = "changes the file system or other processes"
    _SINKS[f"{_m}.open"] = "opens a file descriptor (any flags, O_WRONLY|O_CREAT|O_TRUNC included)"
_WRITE_MODES = set("wax+")


def sink_of(dotted: str) -> str | None:
    """What a call of ``dotted`` does when it is a sink, else None."""
    hit = _SINKS.get(dotted)
    if hit is not None:
        return hit
    mod, _, name = dotted.rpartition(".")
    if mod in ("os", "posix", "nt") and name.startswith(_OS_PREFIXES):
        return "starts or replaces a process"
    if mod in ("subprocess",) and name in ("Popen", "run", "call", "check_call", "check_output",
                                            "getoutput", "getstatusoutput"):
        return "starts a process"
    if mod == "ctypes" or mod.startswith("ctypes.") or mod == "_ctypes":
        return "native code (ctypes)"
    return None


# --- the walk -----------------------------------------------------------------------------------------
# Methods run on an object by a loader (construction, BUILD) or by whatever touches the loaded value
# (str(), dict(x) calls x.keys and x.__getitem__, hash(), iteration, garbage collection).
_PROTOCOL = ("__new__", "__init__", "__setstate__", "__call__", "__del__", "__reduce__",
             "__reduce_ex__", "__repr__", "__str__", "__format__", "__hash__", "__eq__",
             "__iter__", "__len__", "__getitem__", "__contains__", "keys", "__getattr__",
             "__getattribute__", "__bool__", "__init_subclass__", "__class_getitem__",
             "__set_name__", "__enter__", "__exit__", "__index__", "__int__", "__float__")
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
              "lib2to3/tests", "turtledemo", "ensurepip/_bundled"}


def stdlib_files():
    root = sysconfig.get_paths()["stdlib"]
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root).replace(os.sep, "/")
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and
                         f"{rel}/{d}".lstrip("./") not in _SKIP_DIRS and "-" not in d)
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            parts = [] if rel == "." else rel.split("/")
            if f != "__init__.py":
                parts.append(f[:-3])
            if not parts or "-" in parts[-1]:
                continue
            yield ".".join(parts), os.path.join(dirpath, f), f == "__init__.py"


class _Module(ast.NodeVisitor):
    """One module's nodes: dotted name -> set of dotted callees (plus direct sink calls)."""

    def __init__(self, name: str, is_pkg: bool):
        self.name = name
        self.package = name if is_pkg else name.rpartition(".")[0]
        self.imports: dict[str, str] = {}
        self.defs: dict[str, set[str]] = {}
        self.classes: dict[str, list[str]] = {}   # class dotted -> its method dotted names
        self.bases: dict[str, list[str]] = {}
        self.cls: str | None = None
        self.fn: str | None = None

    # imports anywhere in the module (function-level imports alias names the same way)
    def visit_Import(self, node):
        for a in node.names:
            if a.asname:
                self.imports[a.asname] = a.name
            else:
                top = a.name.split(".")[0]
                self.imports[top] = top
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        base = node.module or ""
        if node.level:
            pkg = self.package.split(".") if self.package else []
            pkg = pkg[:len(pkg) - (node.level - 1)] if node.level > 1 else pkg
            base = ".".join(pkg + ([base] if base else []))
        for a in node.names:
            if a.name != "*":
                self.imports[a.asname or a.name] = f"{base}.{a.name}" if base else a.name

    def _def(self, node, kind):
        if self.fn is not None:      # nested functions: their calls belong to the enclosing node
            self.generic_visit(node)
            return
        owner = self.cls
        dotted = f"{owner}.{node.name}" if owner else f"{self.name}.{node.name}"
        self.defs.setdefault(dotted, set())
        if owner:
            self.classes[owner].append(dotted)
        self.fn = dotted
        self.generic_visit(node)
        self.fn = None

    def visit_FunctionDef(self, node):
        self._def(node, "def")

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        if self.fn is not None or self.cls is not None:
            self.generic_visit(node)
            return
        dotted = f"{self.name}.{node.name}"
        self.classes[dotted] = []
        self.defs.setdefault(dotted, set())
        self.bases[dotted] = [b for b in (self._resolve(x) for x in node.bases) if b]
        self.cls = dotted
        self.generic_visit(node)
        self.cls = None

    def _resolve(self, node) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        head = node.id
        parts.reverse()
        if head in ("self", "cls") and self.cls is not None:
            return ".".join([self.cls] + parts)
        if head in self.imports:
            return ".".join([self.imports[head]] + parts)
        if f"{self.name}.{head}" in self.defs or head in self._toplevel:
            return ".".join([f"{self.name}.{head}"] + parts)
        if head in _BUILTINS:
            return ".".join([f"builtins.{head}"] + parts)
        return None

    def visit_Call(self, node):
        if self.fn is not None:
            target = self._resolve(node.func)
            if target is None and isinstance(node.func, ast.Attribute):
                # obj.m() on an object of unknown type: the method m of this module when exactly
                # one class here defines it (typing's _eval_type calls t._evaluate on a ForwardRef)
                target = f"<method>.{node.func.attr}"
            if target is not None:
                if target in ("builtins.open", "io.open", "_io.open", "codecs.open"):
                    if _write_mode(node):
                        self.defs[self.fn].add("<open for writing>")
                elif target in ("os.open", "posix.open") and _read_only_flags(node):
                    pass   # os.open(path, O_RDONLY | O_DIRECTORY): glob's directory reads
                elif target in _CODE_SINKS and node.args and isinstance(node.args[0], ast.Constant):
                    pass   # eval("1"), __import__("os"): code or a module the stdlib fixed
                else:
                    self.defs[self.fn].add(target)
        self.generic_visit(node)


_CODE_SINKS = frozenset({"builtins.eval", "builtins.exec", "builtins.compile", "builtins.__import__",
                         "importlib.import_module", "importlib.__import__"})
_WRITE_FLAGS = frozenset({"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND", "O_EXCL"})


def _read_only_flags(call: ast.Call) -> bool:
    """``os.open(path, flags)`` whose flags are only named O_* constants, none of them a write."""
    flags = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "flags"), None)
    if flags is None:
        return False
    names = [n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(flags)
             if isinstance(n, (ast.Attribute, ast.Name)) and not (isinstance(n, ast.Name) and n.id == "os")]
    return bool(names) and all(n.lstrip("_").startswith("O_") for n in names) and \
        not (set(n.lstrip("_") for n in names) & _WRITE_FLAGS)


# Reviewed: nodes whose sink call takes no argument of the caller's choosing. Each is removed
# from the graph's sink edges with the reason (kept in the output's provenance).
REVIEWED_NOT_CODE_RUNNING = {
    "sysconfig._init_posix": "imports the interpreter's own _sysconfigdata module, named by the "
                             "build (_get_sysconfigdata_name), never by a caller",
}


def _write_mode(call: ast.Call) -> bool:
    """``open(path, mode)``: True unless the mode is a constant without w/a/x/+ (or absent)."""
    mode = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        return False
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return bool(set(mode.value) & _WRITE_MODES)
    return True   # a mode the caller chooses


import builtins as _b  # noqa: E402  (names only)
_BUILTINS = frozenset(dir(_b))
# Method names of builtin types and files: ``str(x).replace`` is not pathlib's Path.replace.
import io as _io  # noqa: E402
_BUILTIN_METHODS = frozenset(n for t in (str, bytes, bytearray, list, dict, set, frozenset, tuple,
                                         int, float, complex, object, memoryview, range, slice,
                                         _io.IOBase, _io.BufferedReader, _io.TextIOWrapper)
                             for n in dir(t))


def parse_all():
    modules: dict[str, _Module] = {}
    for name, path, is_pkg in stdlib_files():
        try:
            with open(path, "rb") as f:
                tree = ast.parse(f.read(), path)
        except (SyntaxError, ValueError, OSError):
            continue
        m = _Module(name, is_pkg)
        m._toplevel = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef,
                                                                    ast.AsyncFunctionDef))}
        m.visit(tree)
        modules[name] = m
    return modules


def derive(sinks_off=frozenset()):
    """node -> the path that reaches a sink; ``sinks_off``: sinks not counted."""
    modules = parse_all()
    graph: dict[str, set[str]] = {}
    classes: dict[str, list[str]] = {}
    bases: dict[str, list[str]] = {}
    for m in modules.values():
        owners: dict[str, list[str]] = {}
        for meths in m.classes.values():
            for meth in meths:
                owners.setdefault(meth.rsplit(".", 1)[1], []).append(meth)
        for node, callees in m.defs.items():
            fixed = set()
            for c in callees:
                if c.startswith("<method>."):
                    name = c[len("<method>."):]
                    hits = owners.get(name, [])
                    if len(hits) == 1 and not name.startswith("__") and name not in _BUILTIN_METHODS:
                        fixed.add(hits[0])
                else:
                    fixed.add(c)
            m.defs[node] = fixed
        graph.update(m.defs)
        classes.update(m.classes)
        bases.update(m.bases)
    # a class's call edge: the protocol methods it defines or inherits (within the stdlib)
    def protocol_methods(c, seen=()):
        out = [f"{c}.{p}" for p in _PROTOCOL if f"{c}.{p}" in graph]
        for b in bases.get(c, ()):
            if b in classes and b not in seen:
                out += [m for m in protocol_methods(b, seen + (c,))
                        if f"{c}.{m.rsplit('.', 1)[1]}" not in graph]
        return out
    for c in classes:
        graph[c] = set(graph.get(c, ())) | set(protocol_methods(c))
    # calling a class runs its constructor: an edge X -> C reaches through C's protocol methods;
    # a call of self.m on a method the class inherits resolves through the bases
    for node in REVIEWED_NOT_CODE_RUNNING:
        graph[node] = set()
    reach: dict[str, list[str]] = {}
    order = sorted(graph)   # deterministic paths (sets iterate in hash order)
    for node in order:
        for c in sorted(graph[node]):
            why = "open() with a write mode" if c == "<open for writing>" else sink_of(c)
            if why is not None and c not in sinks_off:
                reach[node] = [node, c]
                break
    changed = True
    while changed:
        changed = False
        for node in order:
            if node in reach:
                continue
            for c in sorted(graph[node]):
                hit = reach.get(c)
                if hit is None and c not in graph:
                    # self.m inherited from a stdlib base class
                    owner, _, meth = c.rpartition(".")
                    for b in bases.get(owner, ()):
                        if f"{b}.{meth}" in reach:
                            hit = reach[f"{b}.{meth}"]
                            break
                if hit is not None and node not in hit:
                    reach[node] = [node] + hit
                    changed = True
                    break
    return reach


def _sink_text(path: list[str]) -> str:
    last = path[-1]
    return "open() with a write mode" if last == "<open for writing>" else sink_of(last)


def build() -> dict:
    # compile() alone builds a code object and runs nothing: what reaches only compile (typing's
    # special forms build a ForwardRef, which compiles its string) is kept apart from what runs
    reach = derive(frozenset({"builtins.compile"}))
    compiled = derive()
    entries = {k: {"does": _sink_text(v), "path": " -> ".join(v)} for k, v in sorted(reach.items())}
    compile_only = {k: " -> ".join(v) for k, v in sorted(compiled.items()) if k not in reach}
    return {
        "provenance": {
            "generator": "tools/derive_stdlib_gadgets.py",
            "python": sys.version.split()[0],
            "implementation": sys.implementation.name,
            "stdlib": "the interpreter's own Lib/ (sysconfig 'stdlib'), tests excluded",
            "date": datetime.date.today().isoformat(),
            "reviewed": "entries are facts derived from source; the review of what they mean for "
                        "pickles is in tensorscope/policy.py (REVIEWED_NOT_CODE_RUNNING) and "
                        "docs/scan.md",
            "count": len(entries),
            "reviewed_not_code_running": REVIEWED_NOT_CODE_RUNNING,
        },
        "entries": entries,
        "compile_only": compile_only,
    }


def main(argv):
    data = build()
    if "--check" in argv:
        with open(OUT) as f:
            old = json.load(f)
        same = old["entries"] == data["entries"] and old["compile_only"] == data["compile_only"]
        print("matches" if same else "differs", len(old["entries"]), len(data["entries"]))
        return 0 if same else 1
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(data, f, indent=0, sort_keys=True)
        f.write("\n")
    print(f"{len(data['entries'])} entries -> {os.path.relpath(OUT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
