"""TorchScript graphs: each method's ops, read from the archive's ``code/`` sources, never run.

The sources (``model.extras["code"]``, kept by the parser) are TorchScript's own printout of
each class: attribute declarations (``fc1 : __torch__...Linear``) and methods whose bodies are
straight-line Python syntax over ``torch.<op>`` calls, submodule calls ``(fc1).forward(x, )``,
``getattr(layers, "0")`` (children of containers declared as ``__annotations__["0"] = <type>``)
and ``CONSTANTS.c0``. They are parsed with `ast.parse` (a parser: the
text is never compiled or run) and the root's ``forward`` is expanded through its submodules,
as the interpreter would call them: every ``torch.*``/``ops.*`` call becomes a node, named by
the module path that ran it, and an attribute read of a parameter or buffer is linked to the
`TensorInfo` of that path (``fc1.weight``). Both branches of an ``if`` are listed (``branch``
attribute), a loop body once (``loop``). Other methods of the root are listed as graphs too.

TorchScript stores no shapes, so FLOPs need what the file cannot say: nodes are listed with
their parameters and ``uncounted`` FLOPs (use the ONNX or ``.pt2`` export for FLOPs).
"""
from __future__ import annotations

import ast

from .model import Graph, GraphModel, Node, Value

__all__ = ["build"]

MAX_DEPTH = 64          # module nesting expanded
MAX_NODES = 1_000_000   # nodes listed per file
MAX_CALLS = 2_000_000   # method and function expansions per graph (a class calling itself twice
                        # per level would otherwise double the work at every level)
WHY = "TorchScript code stores no shapes"


def _dotted(e: ast.AST) -> str | None:
    parts = []
    while isinstance(e, ast.Attribute):
        parts.append(e.attr)
        e = e.value
    if isinstance(e, ast.Name):
        parts.append(e.id)
        return ".".join(reversed(parts))
    return None


class _Classes:
    def __init__(self, code: dict[str, str]):
        self.classes: dict[str, tuple[ast.ClassDef, dict[str, str]]] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        self.errors: list[str] = []
        for member, text in code.items():
            head, sep, rest = member.partition("/code/")
            if not sep or not rest.endswith(".py"):
                continue
            module = rest[:-3].replace("/", ".")
            try:
                tree = ast.parse(text, filename=member)
            except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
                self.errors.append(f"{member}: not parsed ({type(e).__name__})")
                continue
            for stmt in tree.body:
                if isinstance(stmt, ast.ClassDef):
                    types = {}
                    for s in stmt.body:
                        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                            t = _dotted(s.annotation)
                            if t:
                                types[s.target.id] = t
                        # containers declare children by index: __annotations__["0"] = <type>
                        elif isinstance(s, ast.Assign) and len(s.targets) == 1 and \
                                isinstance(s.targets[0], ast.Subscript) and \
                                _dotted(s.targets[0].value) == "__annotations__" and \
                                isinstance(s.targets[0].slice, ast.Constant) and \
                                isinstance(s.targets[0].slice.value, str):
                            t = _dotted(s.value)
                            if t:
                                types[s.targets[0].slice.value] = t
                    self.classes[f"{module}.{stmt.name}"] = (stmt, types)
                elif isinstance(stmt, ast.FunctionDef):
                    self.functions[f"{module}.{stmt.name}"] = stmt

    def method(self, qualname: str, name: str) -> ast.FunctionDef | None:
        got = self.classes.get(qualname)
        if got is None:
            return None
        for s in got[0].body:
            if isinstance(s, ast.FunctionDef) and s.name == name:
                return s
        return None


class _Expander:
    def __init__(self, classes: _Classes, tensors: dict[str, object], graph: Graph):
        self.c = classes
        self.tensors = tensors
        self.g = graph
        self.counter = 0
        self.calls = 0
        self.truncated = False

    def fresh(self) -> str:
        self.counter += 1
        return f"%{self.counter}"

    # env: local name -> ("value", name) | ("module", path, qualname) | ("param", tensor name)
    def run(self, fn: ast.FunctionDef, path: str, qual: str | None, args: list, depth: int,
            attrs: dict | None = None) -> list:
        self.calls += 1
        if self.calls > MAX_CALLS:
            self.truncated = True
            return []
        env: dict[str, tuple] = {}
        params = [a.arg for a in fn.args.args]
        if params and params[0] == "self" and qual is not None:
            env["self"] = ("module", path, qual)
            params = params[1:]
        for p, a in zip(params, args):
            env[p] = a
        return self.block(fn.body, env, path, depth, attrs or {}) or []

    def block(self, body, env, path, depth, attrs):
        result = None
        for stmt in body:
            if len(self.g.nodes) >= MAX_NODES or self.truncated:
                self.truncated = True
                return result
            if isinstance(stmt, ast.Assign):
                v = self.expr(stmt.value, env, path, depth, attrs)
                for t in stmt.targets:
                    self.bind(t, v, env)
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                self.bind(stmt.target, self.expr(stmt.value, env, path, depth, attrs), env)
            elif isinstance(stmt, ast.Return):
                result = self.expr(stmt.value, env, path, depth, attrs) if stmt.value else None
                result = result if isinstance(result, list) else [result]
            elif isinstance(stmt, ast.Expr):
                self.expr(stmt.value, env, path, depth, attrs)
            elif isinstance(stmt, ast.If):
                self.expr(stmt.test, env, path, depth, attrs)
                r1 = self.block(stmt.body, env, path, depth, {**attrs, "branch": "then"})
                r2 = self.block(stmt.orelse, env, path, depth, {**attrs, "branch": "else"})
                result = result or r1 or r2
            elif isinstance(stmt, (ast.For, ast.While)):
                if isinstance(stmt, ast.For):
                    self.expr(stmt.iter, env, path, depth, attrs)
                    self.bind(stmt.target, ("value", self.fresh()), env)
                self.block(stmt.body, env, path, depth, {**attrs, "loop": True})
        return result

    def bind(self, target, v, env):
        if isinstance(target, ast.Name):
            env[target.id] = v if isinstance(v, tuple) else ("value", self.fresh())
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = v if isinstance(v, list) and len(v) == len(target.elts) else None
            for i, t in enumerate(target.elts):
                self.bind(t, items[i] if items else ("value", self.fresh()), env)

    def attribute(self, base: tuple, attr: str) -> tuple:
        if base[0] != "module":
            return ("value", self.fresh())
        _, path, qual = base
        sub = f"{path}.{attr}" if path else attr
        got = self.c.classes.get(qual)
        t = got[1].get(attr) if got else None
        if t is not None and t in self.c.classes:
            return ("module", sub, t)
        if sub in self.tensors:
            return ("param", sub)
        return ("value", sub)

    def expr(self, e, env, path, depth, attrs):
        if e is None:
            return None
        if isinstance(e, ast.Name):
            return env.get(e.id, ("value", e.id))
        if isinstance(e, ast.Attribute):
            dotted = _dotted(e)
            if dotted and dotted.startswith("CONSTANTS.c") and dotted[11:].isdigit():
                name = f"constants.{dotted[11:]}"
                return ("param", name) if name in self.tensors else ("value", name)
            base = self.expr(e.value, env, path, depth, attrs)
            return self.attribute(base, e.attr) if isinstance(base, tuple) else ("value", self.fresh())
        if isinstance(e, (ast.Tuple, ast.List)):
            return [self.expr(x, env, path, depth, attrs) for x in e.elts]
        if isinstance(e, ast.Call):
            return self.call(e, env, path, depth, attrs)
        if isinstance(e, (ast.BinOp, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.Subscript)):
            for child in ast.iter_child_nodes(e):
                self.expr(child, env, path, depth, attrs)
            return ("value", self.fresh())
        return None

    def call(self, e: ast.Call, env, path, depth, attrs):
        func = e.func
        if isinstance(func, ast.Name) and func.id == "getattr" and len(e.args) == 2 and \
                isinstance(e.args[1], ast.Constant) and isinstance(e.args[1].value, str):
            base = self.expr(e.args[0], env, path, depth, attrs)
            return self.attribute(base, e.args[1].value) if isinstance(base, tuple) else None
        args = [self.expr(a, env, path, depth, attrs) for a in e.args]
        args += [self.expr(k.value, env, path, depth, attrs) for k in e.keywords]
        # a submodule's method: (fc1).forward(x, )
        if isinstance(func, ast.Attribute):
            base = self.expr(func.value, env, path, depth, attrs) \
                if not (_dotted(func) or "").startswith(("torch.", "ops.", "__torch__.")) else None
            if isinstance(base, tuple) and base[0] == "module" and depth < MAX_DEPTH:
                fn = self.c.method(base[2], func.attr)
                if fn is not None:
                    out = self.run(fn, base[1], base[2], args, depth + 1, attrs)
                    return out[0] if len(out) == 1 else out
        dotted = _dotted(func) or ""
        if dotted in self.c.functions and depth < MAX_DEPTH:   # __torch__.torch.nn.functional.relu
            out = self.run(self.c.functions[dotted], path, None, args, depth + 1, attrs)
            return out[0] if len(out) == 1 else out
        if not dotted.startswith(("torch.", "ops.")):
            return ("value", self.fresh())
        op = dotted[6:] if dotted.startswith("torch.") else dotted[4:]
        inputs, params = [], []
        for a in _flat(args):
            if a[0] == "param":
                params.append(a[1])
                inputs.append(Value(a[1], *self._meta(a[1])))
            elif a[0] == "value":
                inputs.append(Value(a[1]))
        out = ("value", self.fresh())
        node = Node(self.g.path, len(self.g.nodes), f"{path}:{op}" if path else op, op, inputs,
                    [Value(out[1])], dict(attrs), domain="torch", module=path,
                    uncounted=WHY)
        node.parameters = list(dict.fromkeys(params))
        self.g.nodes.append(node)
        return out

    def _meta(self, name):
        t = self.tensors.get(name)
        return (t.dtype, tuple(t.shape)) if t is not None else (None, None)


def _flat(args):
    for a in args:
        if isinstance(a, list):
            yield from _flat(a)
        elif isinstance(a, tuple):
            yield a


def build(model) -> GraphModel:
    code = model.extras.get("code") or {}
    classes = _Classes(code)
    tensors = {t.name: t for t in model.tensors}
    root = model.metadata.get("root_class")
    numel = {t.name: t.numel for t in model.tensors if t.role in ("parameter",)
             or t.role.startswith("buffer") or t.role == "constant"}
    params_total = sum(t.numel for t in model.tensors if t.role == "parameter")
    graphs: list[Graph] = []
    notes = list(classes.errors)
    got = classes.classes.get(root) if isinstance(root, str) else None
    if got is None:
        notes.append(f"root class {root!r} has no code in the archive")
    else:
        methods = [s for s in got[0].body if isinstance(s, ast.FunctionDef)]
        methods.sort(key=lambda f: f.name != "forward")
        for fn in methods:
            g = Graph("main" if fn.name == "forward" else f"method/{fn.name}",
                      "graph" if fn.name == "forward" else "method", fn.name)
            g.inputs = [Value(a.arg) for a in fn.args.args[1:]]
            ex = _Expander(classes, tensors, g)
            try:
                ex.run(fn, "", root, [("value", a.arg) for a in fn.args.args[1:]], 0)
            except RecursionError:
                notes.append(f"method {fn.name}: nesting too deep, listed in part")
            if ex.truncated:
                notes.append(f"method {fn.name}: more than {MAX_NODES:,} nodes or {MAX_CALLS:,} "
                             "calls, listed in part")
            for n in g.nodes:
                n.params = sum(numel.get(p, 0) for p in n.parameters
                               if tensors.get(p) is not None and tensors[p].role == "parameter")
            graphs.append(g)
    if not graphs:
        graphs.append(Graph("main", "graph"))
    return GraphModel("torchscript", model.path, graphs, numel, params_total, notes=notes,
                      shapes_from="none")
