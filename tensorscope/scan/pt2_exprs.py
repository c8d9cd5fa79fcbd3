"""The text fields of a ``.pt2`` (torch.export) archive that loading it evaluates, parsed with `ast`.

``torch.export.load`` reads ``models/<name>.json`` with ``json.loads`` and passes every
``expr_str`` (the ``as_expr`` form of a SymInt, SymFloat or SymBool in tensor metadata and
graph values) to ``sympy.sympify``, which runs ``eval`` on it over the sympy namespace and
Python's builtins (torch 2.13, ``torch/_export/serde/serialize.py`` ``_parse_sym_expr``): a
``.pt2`` with no pickle at all runs code on load. Torch writes them with ``sympy.srepr``:
``Mul(Integer(2), Symbol('s17', positive=True, integer=True))``. And ``ExportedProgram.module()``
pastes every ``guards_code`` string into the source of a guard function that it ``exec``\\ s
(``torch/export/_unlift.py`` ``_convert_guards_code_to_fn``; when the archive has sample
inputs), and the guards run on every call of the module: ``L['x'].size()[0] <= 64``.

Each string is parsed with Python's ``ast`` (never compiled or evaluated) and accepted only when
it is made of what those printers write; anything else (attribute access outside the shape
methods, other calls, dunders, lambdas, strings where none belong) is code.
"""
from __future__ import annotations

import ast
import re

MAX_EXPR = 1 << 16      # characters of one expression judged (torch writes tens to hundreds)

# ``sympy.srepr`` class names of shape expressions, and the functions the deserializer puts in
# sympify's locals: torch.utils._sympy.functions.__all__ of torch 2.13 (held to the installed
# torch by tests/test_scan_text_pt2.py).
TORCH_SYMPY_FUNCTIONS = frozenset({
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
    "FloorToInt", "CeilDiv", "IntTrueDiv", "FloatTrueDiv", "LShift", "RShift",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt",
    "RoundDecimal", "ToFloat", "FloatPow", "PowByNatural", "Identity"})
SYMPY_CLASSES = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Max", "Min", "Abs",
    "Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan", "GreaterThan",
    "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "Xor", "Piecewise", "ExprCondPair",
    "floor", "ceiling", "sign", "ITE", "Tuple"})
SYMPY_CONSTANTS = frozenset({"oo", "zoo", "nan", "true", "false", "int_oo", "True", "False",
                             "pi", "E"})
# A bare shape symbol (s0, s77, u3, zuf0): sympify makes it a Symbol.
_SYMBOL_NAME = re.compile(r"[a-z]{1,4}[0-9]{1,9}\Z")
# Only these take strings: a Symbol's name, a Float's digits.
_STRING_TAKERS = frozenset({"Symbol", "Float"})

# guards_code: what torch's PythonPrinter and the export tracer write.
GUARD_CALLS = frozenset({"max", "min", "abs", "int", "float", "bool", "round",
                         "IsNonOverlappingAndDenseIndicator", "cast_symbool_to_symint_guardless"})
GUARD_MODULE_CALLS = {
    "math": frozenset({"floor", "ceil", "trunc", "sqrt", "log2", "log", "exp", "pow", "fabs",
                       "isnan", "isinf", "copysign", "fmod", "remainder"}),
    "torch": frozenset({"sym_float", "sym_int", "sym_sqrt", "sym_max", "sym_min", "sym_ite",
                        "sym_not", "sym_sum", "sym_and", "sym_or", "sym_fresh_size"}),
}
GUARD_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
GUARD_CONSTANTS = frozenset({"inf", "True", "False", "None"})


def _ops_ok(node) -> bool:
    return isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp,
                             ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.Load,
                             ast.Constant))


def _number(node) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float, bool)


def judge_expr(text: str) -> str | None:
    """Why sympify evaluating ``text`` could run code of the file's choosing, None when it is a
    shape expression."""
    if not isinstance(text, str):
        return "not a string"
    if len(text) > MAX_EXPR:
        return f"longer than {MAX_EXPR} characters (not judged)"
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return f"is not a Python expression ({type(e).__name__}): sympy's own transformations " \
            "would rewrite it before eval, so it is not judged"
    return _walk(tree, _expr_node)


def _expr_node(node, parent) -> str | None:
    if _ops_ok(node) and not isinstance(node, ast.Constant):
        return None
    if isinstance(node, ast.Constant):
        if type(node.value) in (int, float, bool) or node.value is None:
            return None
        if isinstance(node.value, str) and isinstance(parent, ast.Call) and \
                isinstance(parent.func, ast.Name) and parent.func.id in _STRING_TAKERS and \
                parent.args and parent.args[0] is node and _plain(node.value):
            return None
        return f"a {type(node.value).__name__} literal {node.value!r:.40} where a shape " \
            "expression holds none"
    if isinstance(node, ast.Name):
        if node.id in SYMPY_CONSTANTS or node.id in TORCH_SYMPY_FUNCTIONS or \
                node.id in SYMPY_CLASSES or _SYMBOL_NAME.match(node.id):
            return None
        return f"the name {node.id!r}, which no shape expression holds (sympify looks it up in " \
            "sympy's namespace and Python's builtins)"
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name) and (f.id in TORCH_SYMPY_FUNCTIONS or f.id in SYMPY_CLASSES):
            for kw in node.keywords:
                if kw.arg is None or not (_number(kw.value) or isinstance(kw.value, ast.Constant)
                                          and isinstance(kw.value.value, bool)):
                    return f"a keyword argument of {f.id} that is not a constant"
            return None
        return f"a call of {ast.unparse(f)[:60]!r}, which is not a sympy or torch shape function"
    if isinstance(node, ast.keyword):
        return None
    return f"{type(node).__name__} syntax ({ast.unparse(node)[:60]!r}), which no shape " \
        "expression holds"


def _plain(s: str) -> bool:
    """A Symbol name or Float digits as torch writes them."""
    return 0 < len(s) <= 64 and all(c.isalnum() or c in "._-+" for c in s) and \
        not s.startswith("_")


def judge_guard(text: str) -> str | None:
    """Why ``ExportedProgram.module()`` executing this guard could run code of the file's
    choosing, None when it is a shape guard."""
    if not isinstance(text, str):
        return "not a string"
    if len(text) > MAX_EXPR:
        return f"longer than {MAX_EXPR} characters (not judged)"
    if any(c in text for c in "\n\r#\\\"\f\v\x00"):
        # the guard is pasted into generated source and its unparsed form into a "..." literal:
        # line breaks, comments, backslashes and double quotes break out of both
        return "holds a line break, comment, backslash or double quote (breaks out of the " \
            "generated source it is pasted into)"
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return f"is not a Python expression ({type(e).__name__}): exec fails on it, not judged"
    return _walk(tree, _guard_node)


def _guard_node(node, parent) -> str | None:
    if _ops_ok(node) and not isinstance(node, ast.Constant):
        return None
    if isinstance(node, ast.Constant):
        if type(node.value) in (int, float, bool) or node.value is None:
            return None
        if isinstance(node.value, str) and isinstance(parent, ast.Subscript) and \
                _plain_key(node.value):
            return None
        return f"a {type(node.value).__name__} literal {node.value!r:.40} outside an input path"
    if isinstance(node, ast.Name):
        if node.id in ("L", "args") or node.id in GUARD_CONSTANTS or node.id in GUARD_CALLS:
            return None
        if node.id in GUARD_MODULE_CALLS and isinstance(parent, ast.Attribute):
            return None
        return f"the name {node.id!r}, which no shape guard holds"
    if isinstance(node, ast.Subscript):
        return None     # L['x'], .size()[0]: the parts are judged on their own
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id in GUARD_MODULE_CALLS and \
                node.attr in GUARD_MODULE_CALLS[node.value.id] and isinstance(parent, ast.Call):
            return None
        if node.attr in GUARD_METHODS and isinstance(parent, ast.Call) and parent.func is node:
            return None
        return f"the attribute {node.attr!r}, which no shape guard reaches"
    if isinstance(node, ast.Call):
        if node.keywords:
            return "a call with keyword arguments"
        f = node.func
        if isinstance(f, ast.Name) and f.id in GUARD_CALLS:
            return None
        if isinstance(f, ast.Attribute):
            return None     # judged as an Attribute (module function or shape method)
        return f"a call of {ast.unparse(f)[:60]!r}, which no shape guard makes"
    if isinstance(node, (ast.Slice, ast.Tuple)):
        return None
    return f"{type(node).__name__} syntax ({ast.unparse(node)[:60]!r}), which no shape guard holds"


def _plain_key(s: str) -> bool:
    return 0 < len(s) <= 256 and all(c.isalnum() or c in "_." for c in s) and "__" not in s


def _walk(tree, judge) -> str | None:
    """The outermost node ``judge`` objects to, walking breadth first (iterative: deep
    expressions are fine)."""
    from collections import deque
    queue = deque([(tree, None)])
    while queue:
        node, parent = queue.popleft()
        why = judge(node, parent)
        if why is not None:
            return why
        queue.extend((child, node) for child in ast.iter_child_nodes(node))
    return None


def fields(doc, limit: int = 1 << 16):
    """(kind, text, where) for every ``expr_str`` and ``guards_code`` entry of a decoded
    model.json (iterative, bounded)."""
    stack = [(doc, "")]
    seen = 0
    while stack and seen < limit:
        node, where = stack.pop()
        seen += 1
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "expr_str" and isinstance(v, str):
                    yield "expr_str", v, where or "model.json"
                elif k == "guards_code" and isinstance(v, list) and not where:
                    for i, g in enumerate(v[:4096]):
                        yield "guards_code", g, f"guards_code[{i}]"
                elif isinstance(v, (dict, list)):
                    stack.append((v, f"{where}.{k}" if where else str(k)))
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(node[:1 << 16])
                         if isinstance(v, (dict, list)))
