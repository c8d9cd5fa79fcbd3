"""A Jinja template judged from the tree jinja2's own parser builds: which attributes it reaches.

Chat templates are rendered by transformers' ``apply_chat_template`` (an immutable sandbox with
the ``loopcontrols`` extension and its own ``{% generation %}`` tag) and by llama.cpp front ends
(llama-cpp-python < 0.2.72 in a plain ``jinja2.Environment``: CVE-2024-34359). Every escape from
a template to the interpreter walks attributes: ``''.__class__.__mro__[1].__subclasses__()``,
``cycler.__init__.__globals__.os``, ``self._TemplateReference__context``. Jinja resolves
``x.name``, ``x['name']``, ``x|attr('name')``, ``map(attribute=...)`` and ``'{0.name}'.format(x)``
through the same getattr, so the question is which names a template can reach, however spelled.

The source is lexed and parsed by jinja2 (``jinja2.parser.Parser``: the lexer that handles
``}}`` inside string literals and decodes ``\\x5f``/``\\U0000005f`` escapes, the parser that
builds the node tree). Nothing is compiled or rendered: ``Environment.parse`` is avoided because
its error path compiles and executes a fake traceback. The tree is then walked with constant
folding: every value is either a few known constants (strings built with ``~``, ``+``, ``*``,
``format``, ``join``, ``replace``, ``first``/``last``, ``dict(a_=1)``, subscripts, ``set``
variables, namespace attributes, macro arguments), or unknown with the set of characters the
template itself put into it (data from ``messages`` contributes none). A name reached that starts
with ``_`` (the sandbox refuses all of them; dunders and mangled ``_Class__private`` names are the
escapes), or one of the attributes the sandbox calls internal (``mro``, ``gi_frame`` ...), is an
escape; a name the template computes from characters that include ``_`` is a suspect; the
printed form of an interpreter object (``lipsum|string|list``) is a suspect, as it is how
underscores are spelled without writing them.
"""
from __future__ import annotations

import functools
import string as _string
from dataclasses import dataclass

MAX_TEMPLATE = 1 << 20      # characters of one template parsed (real ones are a few KB)
MAX_VALUES = 16             # constants tracked per value before it becomes "unknown"
MAX_STR = 4096              # longest folded string (longer: unknown, with its characters)
MAX_STEPS = 200_000         # nodes evaluated per template (loops are walked a few times)
LOOP_PASSES = 3             # a loop body is walked this often so its assignments settle

# Levels, worst first: what a hit means for whoever renders the template.
ESCAPE = "escape"           # reaches a private/dunder/internal attribute
SUSPECT = "suspect"         # computes attribute names from '_' or reads an object's repr
UNPARSED = "unparsed"       # jinja2 cannot parse it: the loader fails, and it is not judged
EVIDENCE = "evidence"       # names an interpreter object without using it
_ORDER = {ESCAPE: 0, SUSPECT: 1, UNPARSED: 2, EVIDENCE: 3}


@functools.lru_cache(maxsize=1)
def _sandbox_internal() -> frozenset[str]:
    """The attributes jinja2's sandbox refuses beyond '_'-names (``is_internal_attribute``):
    read from the installed jinja2, plus ``mro`` (types) and the frame and traceback fields it
    refuses by type."""
    from jinja2 import sandbox
    names = {"mro", "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame",
             "tb_next", "func_globals", "func_code", "im_func", "im_self", "im_class"}
    for attr in dir(sandbox):
        if attr.startswith("UNSAFE_") and attr.endswith("_ATTRIBUTES"):
            names |= set(getattr(sandbox, attr))
    return frozenset(names)


# Globals of every jinja2 Environment: objects whose attributes lead to the interpreter
# (``lipsum.__globals__``), and ``self`` (the TemplateReference).
GADGETS = frozenset({"lipsum", "cycler", "joiner", "namespace", "self", "range", "dict"})
# Filters and tests that take an attribute name (a dotted path) and getattr it.
_ATTRIBUTE_FILTERS = {"attr": 0, "map": None, "selectattr": 0, "rejectattr": 0, "groupby": 0,
                      "sort": None, "unique": None, "min": None, "max": None, "sum": None,
                      "dictsort": None}


@dataclass(frozen=True)
class Hit:
    level: str          # ESCAPE, SUSPECT, UNPARSED or EVIDENCE
    what: str           # a clause: "reaches the attribute", "does not parse (...)"
    evidence: str       # the name or text that shows it
    line: int | None = None


class Value:
    """What an expression can evaluate to: ``values`` (a few constants) or unknown, with the
    characters the template itself contributed (``chars``) and the interpreter object it may be
    (``gadget``)."""

    __slots__ = ("values", "chars", "gadget", "ns", "method")

    def __init__(self, values=None, chars=frozenset(), gadget=None, ns=None, method=None):
        self.values = values        # tuple of constants, or None
        self.chars = chars          # frozenset of characters (for unknown strings)
        self.gadget = gadget        # name of an interpreter object, or None
        self.ns = ns                # namespace(): attr -> Value
        self.method = method        # (Value of constant strings, str method name)

    @staticmethod
    def of(*consts) -> "Value":
        return _bounded(list(consts))

    def known(self) -> bool:
        return self.values is not None

    def all_chars(self) -> frozenset:
        if self.values is None:
            return self.chars
        out: set[str] = set()
        for v in self.values:
            out |= set(_text(v))
        return frozenset(out)


DATA = Value()      # from the context (messages, tools): contributes no character
_PRINTABLE = frozenset(_string.printable)


def _text(v) -> str:
    """A constant's text as Jinja's ``~`` and ``string`` filter make it (bounded)."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, (int, float)):
        return str(v) if abs(v) < 10 ** 100 else "0"
    if isinstance(v, (list, tuple, dict)):
        r = repr(v)
        return r if len(r) <= MAX_STR else r[:MAX_STR]
    return ""


def _size(v) -> int:
    if isinstance(v, (str, list, tuple, dict)):
        return len(v)
    return 1


def _bounded(values: list) -> Value:
    """The constants ``values`` as a Value; unknown (with their characters) past the bounds."""
    out: list = []
    for v in values:
        if _size(v) > MAX_STR or len(out) >= MAX_VALUES:
            return Value(None, frozenset().union(*(set(_text(x)[:MAX_STR])
                                                   for x in values[:4 * MAX_VALUES])))
        if not any(type(v) is type(o) and v == o for o in out):
            out.append(v)
    return Value(tuple(out))


def _union(*vals: Value) -> Value:
    if all(v.known() for v in vals):
        return _bounded([c for v in vals for c in v.values])
    gadget = next((v.gadget for v in vals if v.gadget), None)
    ns = next((v.ns for v in vals if v.ns is not None), None)
    return Value(None, frozenset().union(*(v.all_chars() for v in vals)), gadget, ns)


def _unknown_from(*vals: Value) -> Value:
    """An unknown result computed from ``vals``: it may hold any character they hold."""
    return Value(None, frozenset().union(*(v.all_chars() for v in vals)))


def _fold(fn, *vals: Value) -> Value:
    """``fn`` applied to every combination of the known constants (bounded); unknown when any
    input is, or when ``fn`` refuses the constants."""
    if not all(v.known() for v in vals):
        return _unknown_from(*vals)
    combos: list[tuple] = [()]
    for v in vals:
        combos = [c + (x,) for c in combos for x in v.values]
        if len(combos) > MAX_VALUES:
            return _unknown_from(*vals)
    out = []
    for c in combos:
        try:
            r = fn(*c)
        except Exception:       # the pure helpers below refuse what they cannot fold
            return _unknown_from(*vals)
        out.append(r)
    return _bounded(out)


# -- pure folds of the string building Jinja offers ------------------------------------------------

def _mul(a, b):
    if isinstance(a, int) and isinstance(b, (str, list)):
        a, b = b, a
    if isinstance(a, (str, list)) and isinstance(b, int) and not isinstance(b, bool):
        if len(a) * max(b, 0) > MAX_STR:
            raise ValueError("too long")
        return a * b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if abs(a) > 1 << 64 or abs(b) > 1 << 64:
            raise ValueError("too large")
        return a * b
    raise TypeError


def _add(a, b):
    if isinstance(a, str) and isinstance(b, str) or isinstance(a, list) and isinstance(b, list):
        if len(a) + len(b) > MAX_STR:
            raise ValueError("too long")
        return a + b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a + b
    raise TypeError


def _safe_format(fmt: str) -> str:
    """Refuse a format string that could allocate much (``%999999999s``, ``{:>999999999}``,
    ``*`` widths) or reach attributes (those fields are judged, not folded)."""
    import re
    if "*" in fmt or re.search(r"\d{4}", fmt) or _format_fields(fmt):
        raise ValueError("not folded")
    return fmt


def _percent(fmt, args):
    if isinstance(fmt, str):
        _safe_format(fmt)
    if not isinstance(fmt, str):
        if isinstance(fmt, (int, float)) and isinstance(args, (int, float)) and args:
            return fmt % args
        raise TypeError
    if not isinstance(args, tuple):
        args = (args,)
    if any(not isinstance(a, (str, int, float, bool)) for a in args):
        raise TypeError
    out = fmt % args
    if len(out) > MAX_STR:
        raise ValueError("too long")
    return out


def _first(x):
    if isinstance(x, dict):
        return next(iter(x))
    return x[0]


def _last(x):
    if isinstance(x, dict):
        return list(x)[-1]
    return x[-1]


def _as_list(x):
    if isinstance(x, dict):
        return list(x)
    if isinstance(x, (str, list, tuple)):
        return list(x)
    raise TypeError


def _join(x, sep=""):
    items = _as_list(x)
    out = str(sep).join(_text(i) for i in items)
    if len(out) > MAX_STR:
        raise ValueError("too long")
    return out


def _replace(s, old, new, count=None):
    if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
        raise TypeError
    out = s.replace(old, new) if count is None else s.replace(old, new, int(count))
    if len(out) > MAX_STR:
        raise ValueError("too long")
    return out


def _getitem(obj, key):
    if isinstance(key, slice) or isinstance(key, int) and not isinstance(key, bool):
        if isinstance(obj, (str, list, tuple)):
            return obj[key]
    if isinstance(obj, dict):
        return obj[key]
    raise TypeError


def _str_only(fn):
    def f(s, *args):
        if not isinstance(s, str) or any(not isinstance(a, (str, int)) for a in args):
            raise TypeError
        out = fn(s, *args)
        if isinstance(out, str) and len(out) > MAX_STR:
            raise ValueError("too long")
        return out
    return f


_FILTERS = {
    "first": _first, "last": _last, "list": _as_list, "join": _join, "replace": _replace,
    "string": _text, "format": lambda f, *a: _percent(f, tuple(a)),
    "lower": _str_only(str.lower), "upper": _str_only(str.upper),
    "capitalize": _str_only(str.capitalize), "title": _str_only(str.title),
    "trim": _str_only(lambda s, chars=None: s.strip(chars)), "reverse": lambda x: x[::-1],
    "length": len, "count": len, "int": int, "float": float, "default": lambda x, *a: x,
    "d": lambda x, *a: x, "e": lambda x: x, "escape": lambda x: x, "safe": lambda x: x,
    "center": _str_only(lambda s, w=80: s.center(min(int(w), MAX_STR))),
}
_STR_METHODS = {
    "join": lambda s, items: _join(items, s), "replace": _replace,
    "lower": _str_only(str.lower), "upper": _str_only(str.upper),
    "strip": _str_only(str.strip), "lstrip": _str_only(str.lstrip),
    "rstrip": _str_only(str.rstrip), "title": _str_only(str.title),
    "capitalize": _str_only(str.capitalize), "swapcase": _str_only(str.swapcase),
    "split": _str_only(lambda s, sep=None, n=-1: s.split(sep, n)),
    "casefold": _str_only(str.casefold), "zfill": _str_only(lambda s, w: s.zfill(min(w, MAX_STR))),
    "removeprefix": _str_only(str.removeprefix), "removesuffix": _str_only(str.removesuffix),
}
_REPR_FILTERS = {"string", "list", "join", "format", "pprint", "tojson", "first", "last",
                 "batch", "slice", "wordwrap", "truncate", "center", "urlencode", "e",
                 "escape", "forceescape", "lower", "upper", "title", "capitalize", "trim",
                 "reverse", "random"}


def _format_fields(fmt: str) -> list[str]:
    """The attribute and item names a ``str.format`` string reaches (``{0.__class__}``,
    ``{x[__globals__]}``), read with the standard library's own format parser."""
    names: list[str] = []

    def walk(f: str, depth: int) -> None:
        try:
            parsed = list(_string.Formatter().parse(f))
        except ValueError:
            return
        for _, field, spec, _ in parsed:
            if field:
                try:
                    _, rest = _string_formatter_field_name_split(field)
                except ValueError:
                    rest = []
                names.extend(str(n) for _, n in rest)
            if spec and depth < 2:
                walk(spec, depth + 1)
    walk(fmt, 0)
    return names


def _string_formatter_field_name_split(field: str):
    import _string as cformat
    first, rest = cformat.formatter_field_name_split(field)
    return first, list(rest)


# -- the parse ----------------------------------------------------------------------------------

def _environment():
    """An Environment shaped like the renderers': transformers adds ``loopcontrols`` and its
    ``{% generation %}`` block (``AssistantTracker``); llama-cpp-python a plain one. Only its
    lexer and parser are used."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        """transformers' ``{% generation %}...{% endgeneration %}``, parsed as it parses it."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    # ``do`` too: llama.cpp's own Jinja engine renders it; a wider parse only judges more
    return jinja2.Environment(trim_blocks=True, lstrip_blocks=True,
                              extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do", Generation])


_ENV = None


def parse(text: str):
    """The jinja2 node tree of ``text``. Raises jinja2's TemplateSyntaxError, RecursionError."""
    global _ENV
    from jinja2.parser import Parser
    if _ENV is None:
        _ENV = _environment()
    return Parser(_ENV, text, "template").parse()


def findings(text: str) -> list[Hit]:
    """Every hit of one template, worst first (empty: an ordinary template)."""
    from jinja2.exceptions import TemplateSyntaxError
    if len(text) > MAX_TEMPLATE:
        return [Hit(UNPARSED, f"is larger than {MAX_TEMPLATE >> 20} MiB and was not parsed",
                    f"{len(text)} characters")]
    try:
        tree = parse(text)
    except TemplateSyntaxError as e:
        return [Hit(UNPARSED, f"does not parse as Jinja (line {e.lineno}: {e.message}): "
                    "rendering it fails, and it was not judged", str(e.message)[:80], e.lineno)]
    except (RecursionError, MemoryError):
        return [Hit(UNPARSED, "nests too deeply for jinja2's parser: rendering it fails, and it "
                    "was not judged", "nesting")]
    walker = _Walker()
    try:
        walker.body(tree.body, {})
    except RecursionError:
        walker.hit(SUSPECT, "nests expressions too deeply to judge", "nesting", None)
    except _Budget:
        walker.hit(UNPARSED, f"takes more than {MAX_STEPS} evaluation steps to judge; the rest "
                   "was not judged", "steps", None)
    return sorted(walker.hits.values(), key=lambda h: _ORDER[h.level])


class _Budget(Exception):
    pass


class _Walker:
    """Abstract evaluation of a template body: scopes map names to `Value`s; assignments inside
    loops and branches merge with what was there (a name may hold any value it is ever given)."""

    def __init__(self):
        self.hits: dict[tuple[str, str], Hit] = {}
        self.macros: dict[str, object] = {}
        self.steps = 0
        self.macro_depth = 0
        self.memo: dict[tuple, Value] = {}     # (macro, arguments) -> what it outputs

    def hit(self, level: str, what: str, evidence: str, line) -> None:
        key = (level, evidence)
        if key not in self.hits and len(self.hits) < 64:
            self.hits[key] = Hit(level, what, evidence, line)

    # -- statements -----------------------------------------------------------------------------
    def body(self, stmts, scope: dict) -> Value:
        """Walk statements; returns what they output (for macros and ``{% set %}`` blocks)."""
        out: list[Value] = []
        for node in stmts:
            v = self.stmt(node, scope)
            if v is not None:
                out.append(v)
        return self.concat(out)

    def stmt(self, node, scope: dict):
        from jinja2 import nodes as n
        self.tick()
        if isinstance(node, n.Output):
            vals = []
            for x in node.nodes:
                v = self.expr(x, scope)
                if v.gadget is not None:
                    self.hit(EVIDENCE, f"outputs the interpreter object {v.gadget!r}", v.gadget,
                             node.lineno)
                    v = Value(None, _PRINTABLE)
                vals.append(v)
            return self.concat(vals)
        if isinstance(node, n.Assign):
            self.assign(node.target, self.expr(node.node, scope), scope)
        elif isinstance(node, n.AssignBlock):
            v = self.body(node.body, dict(scope))
            if node.filter is not None:
                v = self.filter(node.filter, v, scope)
            self.assign(node.target, v, scope)
        elif isinstance(node, n.For):
            self.loop(node, scope)
        elif isinstance(node, n.If):
            self.expr(node.test, scope)
            a = self.body(node.body, scope)
            for elif_ in node.elif_:
                self.expr(elif_.test, scope)
                a = _union(a, self.body(elif_.body, scope))
            return _union(a, self.body(node.else_, scope)) if node.else_ else a
        elif isinstance(node, n.Macro):
            self.macros[node.name] = node
            inner = dict(scope)
            for arg in node.args:
                inner[arg.name] = DATA
            for d in node.defaults:
                self.expr(d, scope)
            # judged once with unknown arguments; calls with constants are walked again
            self.memo[(node.name, ())] = self.body(node.body, inner)
            scope[node.name] = Value(None, frozenset(), gadget=None)
        elif isinstance(node, n.CallBlock):
            inner = dict(scope)
            for arg in node.args:
                inner[arg.name] = DATA
            self.body(node.body, inner)
            return self.expr(node.call, scope)
        elif isinstance(node, n.FilterBlock):
            return self.filter(node.filter, self.body(node.body, scope), scope)
        elif isinstance(node, n.With):
            inner = dict(scope)
            for target, value in zip(node.targets, node.values):
                self.assign(target, self.expr(value, scope), inner)
            return self.body(node.body, inner)
        elif isinstance(node, (n.Scope, n.ScopedEvalContextModifier, n.OverlayScope)):
            return self.body(node.body, scope)
        elif isinstance(node, n.ExprStmt):
            self.expr(node.node, scope)
        elif isinstance(node, (n.Include, n.Import, n.FromImport, n.Extends)):
            self.expr(node.template, scope)
            self.hit(EVIDENCE, "loads another template by name (chat renderers have no loader, "
                     "so rendering fails)", type(node).__name__.lower(), node.lineno)
        elif isinstance(node, n.Block):
            return self.body(node.body, scope)
        else:
            for child in node.iter_child_nodes():
                if isinstance(child, n.Expr):
                    self.expr(child, scope)
                elif isinstance(child, n.Stmt):
                    self.stmt(child, scope)
        return None

    def loop(self, node, scope: dict) -> None:
        items = self.expr(node.iter, scope)
        element = self.elements(items)
        out = None
        for _ in range(LOOP_PASSES):
            self.assign(node.target, element, scope)
            scope.setdefault("loop", DATA)
            if node.test is not None:
                self.expr(node.test, scope)
            out = self.body(node.body, scope)
        self.body(node.else_, scope)
        return out

    def elements(self, items: Value) -> Value:
        """What iterating ``items`` yields."""
        if items.known():
            elems: list = []
            for v in items.values:
                if isinstance(v, (str, list, tuple)):
                    elems.extend(v[:MAX_STR])
                elif isinstance(v, dict):
                    elems.extend(v)
                else:
                    return _unknown_from(items)
            return _bounded(elems)
        return Value(None, items.all_chars())

    def assign(self, target, value: Value, scope: dict) -> None:
        from jinja2 import nodes as n
        if isinstance(target, n.Name):
            old = scope.get(target.name)
            scope[target.name] = value if old is None else _union(old, value)
        elif isinstance(target, n.NSRef):
            ns = scope.get(target.name)
            if ns is not None and ns.ns is not None:
                old = ns.ns.get(target.attr)
                ns.ns[target.attr] = value if old is None else _union(old, value)
        elif isinstance(target, n.Tuple):
            element = self.elements(value) if value.known() else _unknown_from(value)
            for item in target.items:
                self.assign(item, element, scope)

    # -- expressions ----------------------------------------------------------------------------
    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _Budget

    def concat(self, vals: list[Value], line=None) -> Value:
        for i, v in enumerate(vals):
            if v.gadget is not None:
                self.hit(SUSPECT, f"reads the printed form of the interpreter object "
                         f"{v.gadget!r} (~): a way to spell '_' without writing it", v.gadget, line)
                vals[i] = Value(None, _PRINTABLE)
        if not vals:
            return Value.of("")
        acc = vals[0]
        for v in vals[1:]:
            acc = _fold(lambda a, b: _add(_text(a), _text(b)), acc, v)
        return _fold(_text, acc) if acc.known() else acc

    def expr(self, node, scope: dict) -> Value:
        from jinja2 import nodes as n
        self.tick()
        if isinstance(node, n.Const):
            return Value.of(node.value) if isinstance(node.value, (str, int, float, bool,
                                                                   type(None))) else DATA
        if isinstance(node, n.TemplateData):
            return Value.of(node.data)
        if isinstance(node, n.Name):
            if node.name in scope:
                return scope[node.name]
            if node.name in GADGETS:
                return Value(None, frozenset(), gadget=node.name)
            return DATA
        if isinstance(node, (n.Tuple, n.List)):
            items = [self.expr(x, scope) for x in node.items]
            return _fold(lambda *xs: list(xs), *items) if items else Value.of([])
        if isinstance(node, n.Dict):
            pairs = [(self.expr(p.key, scope), self.expr(p.value, scope)) for p in node.items]
            flat = [x for pair in pairs for x in pair]
            return _fold(lambda *xs: dict(zip(xs[::2], xs[1::2])), *flat) if flat else \
                Value.of({})
        if isinstance(node, n.Concat):
            return self.concat([self.expr(x, scope) for x in node.nodes], node.lineno)
        if isinstance(node, (n.Add, n.Sub, n.Mul, n.Div, n.FloorDiv, n.Mod, n.Pow)):
            a, b = self.expr(node.left, scope), self.expr(node.right, scope)
            if isinstance(node, n.Add):
                return _fold(_add, a, b)
            if isinstance(node, n.Mul):
                return _fold(_mul, a, b)
            if isinstance(node, n.Mod):
                return _fold(lambda f, x: _percent(f, tuple(x) if isinstance(x, list) else x),
                             a, b)
            return _unknown_from(a, b)
        if isinstance(node, n.CondExpr):
            self.expr(node.test, scope)
            a = self.expr(node.expr1, scope)
            return _union(a, self.expr(node.expr2, scope)) if node.expr2 is not None else a
        if isinstance(node, (n.And, n.Or)):
            return _union(self.expr(node.left, scope), self.expr(node.right, scope))
        if isinstance(node, n.Getattr):
            return self.getattr(self.expr(node.node, scope), Value.of(node.attr), node.lineno,
                                scope, "attribute")
        if isinstance(node, n.Getitem):
            obj = self.expr(node.node, scope)
            if isinstance(node.arg, n.Slice):
                parts = [self.expr(p, scope) if p is not None else Value.of(None)
                         for p in (node.arg.start, node.arg.stop, node.arg.step)]
                if obj.gadget is not None:
                    return Value(None, _PRINTABLE)
                return _fold(lambda o, a, b, c: _getitem(o, slice(a, b, c)), obj, *parts)
            key = self.expr(node.arg, scope)
            return self.getattr(obj, key, node.lineno, scope, "item")
        if isinstance(node, n.Filter):
            return self.filter(node, self.expr(node.node, scope) if node.node is not None
                               else DATA, scope)
        if isinstance(node, n.Test):
            self.expr(node.node, scope)
            self.args(node, scope)
            return DATA
        if isinstance(node, n.Call):
            return self.call(node, scope)
        if isinstance(node, (n.Not, n.Neg, n.Pos)):
            self.expr(node.node, scope)
            return DATA
        if isinstance(node, n.Compare):
            self.expr(node.expr, scope)
            for op in node.ops:
                self.expr(op.expr, scope)
            return DATA
        if isinstance(node, (n.MarkSafe, n.MarkSafeIfAutoescape)):
            return self.expr(node.expr, scope)
        if isinstance(node, n.Slice):
            for p in (node.start, node.stop, node.step):
                if p is not None:
                    self.expr(p, scope)
            return DATA
        for child in node.iter_child_nodes():
            if isinstance(child, n.Expr):
                self.expr(child, scope)
        return DATA

    def args(self, node, scope: dict) -> tuple[list[Value], dict[str, Value]]:
        pos = [self.expr(a, scope) for a in node.args]
        kw = {k.key: self.expr(k.value, scope) for k in node.kwargs}
        if node.dyn_args is not None:
            pos.append(self.expr(node.dyn_args, scope))
        if node.dyn_kwargs is not None:
            self.expr(node.dyn_kwargs, scope)
        return pos, kw

    def reach(self, name: Value, line, how: str) -> None:
        """Judge an attribute name a template reaches (``how``: attribute, item, attr() ...)."""
        if name.known():
            for v in name.values:
                if not isinstance(v, str):
                    continue
                for part in (v.split(".") if "attribute path" in how else [v]):
                    if part.startswith("_"):
                        kind = "dunder" if part.startswith("__") else "private"
                        self.hit(ESCAPE, f"reaches the {kind} attribute {part!r} through {how}",
                                 part, line)
                    elif part in _sandbox_internal():
                        self.hit(ESCAPE, f"reaches the interpreter-internal attribute {part!r} "
                                 f"through {how}", part, line)
        elif "_" in name.chars:
            self.hit(SUSPECT, f"computes an attribute name through {how} from characters that "
                     "include '_' (a dunder spelled in pieces)", "".join(sorted(name.chars))[:40],
                     line)

    def getattr(self, obj: Value, key: Value, line, scope, how: str) -> Value:
        # Jinja's getattr/getitem fall back to each other for string names: both reach attributes
        if how == "item" and key.known() and all(isinstance(k, (int, bool)) for k in key.values):
            if obj.gadget is not None:
                return obj
            return _fold(_getitem, obj, key)
        self.reach(key, line, how)
        if obj.gadget is not None:
            if how == "item" and not key.known():
                return Value(None, _PRINTABLE, gadget=None)
            return Value(None, frozenset(), gadget=obj.gadget)
        if obj.ns is not None and key.known() and len(key.values) == 1 and \
                key.values[0] in obj.ns:
            return obj.ns[key.values[0]]
        if obj.known() and key.known():
            if how == "attribute" and all(isinstance(o, str) for o in obj.values) and \
                    key.values[0] in _STR_METHODS:
                return Value(None, frozenset(), method=(obj, key.values[0]))
            return _fold(_getitem, obj, key)
        return DATA

    def filter(self, node, value: Value, scope: dict) -> Value:
        pos, kw = self.args(node, scope)
        name = node.name
        if name in _ATTRIBUTE_FILTERS:
            at = _ATTRIBUTE_FILTERS[name]
            if "attribute" in kw:
                self.reach(kw["attribute"], node.lineno, f"the {name} filter's attribute path")
            if at is not None and len(pos) > at:
                self.reach(pos[at], node.lineno, "the attr filter" if name == "attr" else
                           f"the {name} filter's attribute path")
            if name == "map" and pos and pos[0].known() and "attr" in pos[0].values and \
                    len(pos) > 1:
                self.reach(pos[1], node.lineno, "map('attr', ...)")
            if name == "attr":
                return Value(None, frozenset(), gadget=value.gadget) if value.gadget else DATA
        if value.gadget is not None and name in _REPR_FILTERS:
            self.hit(SUSPECT, f"reads the printed form of the interpreter object {value.gadget!r} "
                     f"(|{name}): a way to spell '_' without writing it", value.gadget,
                     node.lineno)
            return Value(None, _PRINTABLE)
        fn = _FILTERS.get(name)
        if fn is None:
            return _unknown_from(value, *pos, *kw.values())
        return _fold(fn, value, *pos) if not kw else _unknown_from(value, *pos, *kw.values())

    def call(self, node, scope: dict) -> Value:
        from jinja2 import nodes as n
        target = node.node
        callee = self.expr(target, scope)
        pos, kw = self.args(node, scope)
        if isinstance(target, n.Getattr) and target.attr in ("format", "format_map"):
            obj = self.expr(target.node, scope)
            if obj.known():
                for fmt in obj.values:
                    if isinstance(fmt, str):
                        for field in _format_fields(fmt):
                            self.reach(Value.of(field), node.lineno, "a str.format field")
            elif "_" in obj.chars:
                self.reach(Value(None, obj.chars), node.lineno, "a computed str.format string")
            if obj.known() and target.attr == "format" and not kw:
                return _fold(lambda f, *a: _format_plain(f, a), obj, *pos)
            return _unknown_from(obj, *pos, *kw.values())
        if callee.method is not None:
            obj, name = callee.method
            return _fold(_STR_METHODS[name], obj, *pos) if not kw else _unknown_from(obj, *pos)
        if isinstance(target, n.Name) and target.name not in scope:
            if target.name == "dict" and not pos:
                return _fold(lambda *xs: dict(zip(kw, xs)), *kw.values()) if kw else Value.of({})
            if target.name == "namespace":
                return Value(None, frozenset(), ns=dict(kw))
            if target.name == "range":
                return _fold(lambda *a: list(range(*a)) if len(range(*a)) <= 256 else
                             _raise(), *pos)
            if target.name in ("lipsum", "cycler", "joiner"):
                return _unknown_from(*pos, *kw.values())
        if isinstance(target, n.Name) and target.name in self.macros and \
                self.macro_depth < 4:
            return self.macro_call(self.macros[target.name], pos, kw)
        return _unknown_from(*pos, *kw.values()) if callee.gadget is None else \
            Value(None, frozenset(), gadget=callee.gadget)

    def macro_call(self, macro, pos: list[Value], kw: dict[str, Value]) -> Value:
        """A macro called with arguments the template chose: its body walked with them bound
        (what it outputs is its value)."""
        inner: dict[str, Value] = {}
        for i, arg in enumerate(macro.args):
            inner[arg.name] = pos[i] if i < len(pos) else kw.get(arg.name, DATA)
        key = (macro.name, tuple((k, _signature(v)) for k, v in inner.items()
                                 if v.known() or v.chars or v.gadget))
        if key in self.memo:
            return self.memo[key]
        self.macro_depth += 1
        try:
            out = self.memo[key] = self.body(macro.body, inner)
            return out
        finally:
            self.macro_depth -= 1


def _signature(v: Value) -> tuple:
    return (repr(v.values)[:512], "".join(sorted(v.chars)), v.gadget)


def _raise():
    raise ValueError


def _format_plain(fmt: str, args: tuple):
    if any(not isinstance(a, (str, int, float, bool)) for a in args):
        raise TypeError
    out = _safe_format(fmt).format(*args)   # constants only, no attribute fields
    if len(out) > MAX_STR:
        raise ValueError
    return out
