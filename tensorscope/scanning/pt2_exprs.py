"""The text fields of a ``.pt2`` (torch.export) archive that loading it evaluates, read as code.

``torch.export.load`` reads ``models/<name>.json`` with ``json.loads`` and passes every
``expr_str`` (the ``as_expr`` form of a SymInt, SymFloat or SymBool in tensor metadata and
graph values) to ``sympy.sympify``, which runs ``eval`` on it over the sympy namespace and
Python's builtins (torch 2.13, ``torch/_export/serde/serialize.py`` ``_parse_sym_expr``): a
``.pt2`` with no pickle at all runs code on load. Torch writes them with ``sympy.srepr``:
``Mul(Integer(2), Symbol('s17', positive=True, integer=True))``. And ``ExportedProgram.module()``
pastes every ``guards_code`` string into the source of a guard function that it ``exec``\\ s
(``torch/export/_unlift.py`` ``_convert_guards_code_to_fn``; when the archive has sample
inputs), and the guards run on every call of the module: ``L['x'].size()[0] <= 64``.

Each string is read with Python's own tokenizer (what sympy's ``parse_expr`` reads before it
evals) and a recursive-descent reader of the few shapes those printers write: never compiled,
not even through ``ast.parse`` (the scan makes no ``compile`` call). Anything outside them
(attribute access beyond the shape methods, other calls, dunders, lambdas, subscripts, strings
where none belong, f-strings) is code.
"""
from __future__ import annotations

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


def judge_expr(text: str) -> str | None:
    """Why sympify evaluating ``text`` could run code of the file's choosing (what it holds that
    no shape expression does), None when it is a shape expression."""
    if not isinstance(text, str):
        return "not a string"
    if len(text) > MAX_EXPR:
        return f"longer than {MAX_EXPR} characters (not judged)"
    return _judge(text, guard=False)


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
        return "a line break, comment, backslash or double quote (breaks out of the generated " \
            "source it is pasted into)"
    return _judge(text, guard=True)


class _Reject(Exception):
    pass


_BINARY = frozenset({"+", "-", "*", "/", "//", "%", "**", "==", "!=", "<", "<=", ">", ">=",
                     "and", "or", "&", "|", "^"})
_UNARY = frozenset({"-", "+", "not", "~"})


def _tokens(text: str) -> list[tuple[int, str]]:
    """Python's own tokenizer (what sympy's parse_expr reads too), without compiling: the
    scan never calls ``compile``, not even through ``ast.parse``."""
    import io
    import tokenize
    out: list[tuple[int, str]] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT,
                            tokenize.DEDENT):
                continue
            if tok.type not in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING, tokenize.OP):
                raise _Reject(f"the token {tok.string!r:.40}")
            out.append((tok.type, tok.string))
            if len(out) > MAX_EXPR:
                raise _Reject("too many tokens")
    except (tokenize.TokenError, SyntaxError, ValueError) as e:
        raise _Reject(f"text Python's tokenizer rejects ({type(e).__name__})") from None
    return out


class _Parser:
    """A recursive-descent reader of the few shapes torch writes; anything outside them raises
    `_Reject` saying what it met. ``guard`` selects the guards_code shapes."""

    def __init__(self, toks, guard: bool):
        import tokenize
        self.t, self.i, self.guard, self.depth = toks, 0, guard, 0
        self.NAME, self.NUMBER, self.STRING = tokenize.NAME, tokenize.NUMBER, tokenize.STRING

    def peek(self, k: int = 0):
        j = self.i + k
        return self.t[j] if j < len(self.t) else (None, None)

    def take(self, want: str | None = None):
        tok = self.peek()
        if tok[0] is None or (want is not None and tok[1] != want):
            raise _Reject(f"{tok[1]!r} where {want!r} belongs" if want else "a cut expression")
        self.i += 1
        return tok

    def done(self) -> None:
        self.expr()
        if self.i != len(self.t):
            raise _Reject(f"{self.peek()[1]!r:.40} after a complete expression")

    def expr(self) -> None:
        self.depth += 1
        if self.depth > 200:
            raise _Reject("nesting deeper than any shape expression")
        self.unary()
        while self.peek()[0] is not None and self.peek()[1] in _BINARY:
            self.take()
            self.unary()
        self.depth -= 1

    def unary(self) -> None:
        while self.peek()[1] in _UNARY:
            self.take()
        self.atom()

    def atom(self) -> None:
        kind, text = self.take()
        if text == "(":
            self.expr()
            self.take(")")
            return
        if kind == self.NUMBER:
            return
        if kind == self.STRING:
            raise _Reject(f"a string literal {text[:40]} where a shape expression holds none")
        if kind != self.NAME:
            raise _Reject(f"{text!r}, which no shape expression holds")
        if self.guard:
            return self.guard_name(text)
        if self.peek()[1] == "(":
            if text not in TORCH_SYMPY_FUNCTIONS and text not in SYMPY_CLASSES:
                raise _Reject(f"a call of {text!r}, which is not a sympy or torch shape function")
            return self.call_args(text)
        if text in SYMPY_CONSTANTS or _SYMBOL_NAME.match(text):
            return
        raise _Reject(f"the name {text!r}, which no shape expression holds (sympify looks it up "
                      "in sympy's namespace and Python's builtins)")

    def call_args(self, fn: str) -> None:
        self.take("(")
        first = True
        while self.peek()[1] != ")":
            kind, text = self.peek()
            if kind == self.NAME and self.peek(1)[1] == "=" and not self.guard:
                self.take()
                self.take("=")
                self.keyword_value(fn)
            elif first and kind == self.STRING and fn in _STRING_TAKERS and not self.guard:
                self.take()
                if not (text[:1] in "'\"" and _plain(text[1:-1])):
                    raise _Reject(f"the string {text[:40]} as {fn}'s argument")
            else:
                self.expr()
            first = False
            if self.peek()[1] == ",":
                self.take(",")
            elif self.peek()[1] != ")":
                raise _Reject(f"{self.peek()[1]!r} in the arguments of {fn}")
        self.take(")")

    def keyword_value(self, fn: str) -> None:
        if self.peek()[1] == "-":
            self.take()
        kind, text = self.take()
        if kind == self.NUMBER or text in ("True", "False"):
            return
        raise _Reject(f"a keyword argument of {fn} that is not a constant ({text!r:.40})")

    def guard_name(self, text: str) -> None:
        nxt = self.peek()[1]
        if text in ("L", "args"):
            while self.peek()[1] in ("[", "."):
                if self.take()[1] == "[":
                    kind, key = self.take()
                    if not (kind == self.NUMBER or kind == self.STRING and key[:1] == "'" and
                            _plain_key(key[1:-1])):
                        raise _Reject(f"the input key {key[:40]}")
                    self.take("]")
                else:
                    method = self.take()[1]
                    if method not in GUARD_METHODS:
                        raise _Reject(f"the attribute {method!r}, which no shape guard reaches")
                    self.take("(")
                    self.take(")")
            return
        if text in GUARD_MODULE_CALLS and nxt == ".":
            self.take(".")
            name = self.take()[1]
            if name not in GUARD_MODULE_CALLS[text]:
                raise _Reject(f"{text}.{name}, which no shape guard calls")
            return self.call_args(f"{text}.{name}")
        if text in GUARD_CALLS and nxt == "(":
            return self.call_args(text)
        if text in GUARD_CONSTANTS:
            return
        raise _Reject(f"the name {text!r}, which no shape guard holds")


def _judge(text: str, guard: bool) -> str | None:
    try:
        _Parser(_tokens(text), guard).done()
    except _Reject as e:
        return str(e)
    except RecursionError:
        return "nesting deeper than any shape expression"
    return None


def _plain(s: str) -> bool:
    """A Symbol name or Float digits as torch writes them."""
    return 0 < len(s) <= 64 and all(c.isalnum() or c in "._-+" for c in s) and \
        not s.startswith("_")


def _plain_key(s: str) -> bool:
    return 0 < len(s) <= 256 and all(c.isalnum() or c in "_." for c in s) and "__" not in s


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
