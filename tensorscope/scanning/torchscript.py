"""TorchScript code rules: calls in a ``code/`` file must stay within torch, ops and the
TorchScript builtins; and Python sources other archives carry for their loaders to import
(TorchServe handlers, torch.package modules). The code is tokenized (pure Python), never
compiled."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from . import context   # CODE_CHARS_PER_FILE: the budget of all code in one scanned file

if TYPE_CHECKING:
    from .context import ScanContext

# =================================================================================================
# TorchScript code

_TS_OK_ROOTS = {"torch", "ops", "__torch__", "CONSTANTS", "annotate", "uninitialized",
                "unchecked_cast", "isinstance", "getattr", "hasattr", "len", "int", "float", "bool",
                "str", "range", "enumerate", "zip", "min", "max", "abs", "round", "print", "list",
                "dict", "tuple", "sorted", "sum", "divmod", "chr", "ord", "hash", "id", "math",
                "warnings", "RuntimeError", "AssertionError", "ValueError", "Exception",
                "NotImplementedError", "IndexError", "KeyError", "TypeError", "StopIteration",
                "ZeroDivisionError", "fork", "wait", "_unwrap_optional", "complex", "all", "any",
                "reversed", "divmod", "bin", "hex", "oct", "super", "Tensor", "Optional", "List",
                "Dict", "Tuple", "Union", "Future", "Any", "NoneType", "Device", "__is__",
                "__isnot__", "__not__", "__contains__", "__getitem__", "__range_length",
                "__derive_index", "__interpolate", "_list_with_default", "uninitialized", "self"}
_TS_DANGER_ROOTS = {"os", "sys", "subprocess", "builtins", "eval", "exec", "open", "__import__",
                    "compile", "socket", "importlib", "pickle", "marshal", "ctypes", "shutil"}
_STANDARD_OP_NAMESPACES = {"aten", "prim", "quantized", "_quantized", "quantized_decomposed",
                           "profiler", "_caffe2", "sparse", "prepacked", "_test", "cuda", "mkldnn",
                           "mkldnn_prepacked", "xnnpack", "_nnapi", "vulkan", "metal", "onednn"}


# TorchScript builtins that reach the file system from compiled code: aten::save writes a pickle
# to any path, aten::from_file maps (shared=True: creates and resizes) any file. Everything else
# under torch.* stays in memory.
_TS_FILE_CALLS = {"torch.save", "torch.load", "torch.from_file", "torch.ops.aten.save",
                  "torch.ops.aten.from_file", "ops.aten.save", "ops.aten.from_file",
                  "torch.UntypedStorage.from_file", "torch.TypedStorage.from_file",
                  "torch.jit.load", "torch.jit.save"}


_TS_SAFE_IMPORT_ROOTS = ("torch", "__torch__", "typing", "__future__", "math", "warnings")


_BLANKS = re.compile(r"[ \t\f]+")
MAX_CODE_CHARS = 8 << 20   # of one code file judged; the rest is reported unread (real: KBs-MBs)
_WINDOW = 1 << 14          # tokens kept ahead of the one looked at (lookahead of a statement)


def _code_tokens(text: str):
    """(type, string, line) of each Python token of a code file, lazily, via the pure-Python
    tokenizer: nothing is compiled (the `compile` audit event never fires), deep nesting cannot
    exhaust the C parser's stack, and memory stays bounded whatever the file's size."""
    import io
    import tokenize
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING)
    # tokenize reads a run of blanks ending in a character no token starts with (`!`) once per
    # blank (an ERRORTOKEN each: quadratic). Every run of blanks becomes one space: every token
    # and its line are kept, and every indented line sits at one level (indentation is not read
    # here, and one level is always consistent).
    text = _BLANKS.sub(" ", text)
    for t in tokenize.generate_tokens(io.StringIO(text).readline):
        if t.type not in skip:
            yield t.type, t.string, t.start[0]


def _code_calls_and_bindings(tokens):
    """(calls, bound, imports): dotted call targets with the line of their first call, locally
    bound names, and imported module names with their line. A call is ``NAME(.NAME)* (`` not
    preceded by ``.`` or ``def``/``class``. ``tokens`` (`_code_tokens`) are read through a
    window: one token behind, `_WINDOW` ahead."""
    state = _TokenScan()
    buf: list = []
    start = 0
    it = iter(tokens)
    done = False
    while True:
        while not done and len(buf) - start < 2 * _WINDOW:
            tok = next(it, None)
            if tok is None:
                done = True
            else:
                buf.append(tok)
        end = len(buf) if done else len(buf) - _WINDOW
        state.scan(buf, start, end)
        if done:
            break
        keep = end - 1              # one token of context behind the next one to look at
        del buf[:keep]
        state.shift(keep)
        start = 1
    return list(state.calls.items()), state.bound, state.imports


class _TokenScan:
    """`_code_calls_and_bindings`' pass over one window of tokens."""

    def __init__(self):
        self.calls: dict[str, int] = {}     # dotted call target -> line of its first call
        self.bound: set[str] = set()
        self.imports: list[tuple[str, int]] = []
        self.from_import = -1   # index of the `import` of a `from a import b` (not a module)

    def shift(self, dropped: int) -> None:
        self.from_import -= dropped

    def scan(self, tokens: list, lo: int, hi: int) -> None:
        import keyword
        import tokenize
        NAME = tokenize.NAME
        calls, bound, imports = self.calls, self.bound, self.imports
        n = len(tokens)
        for i in range(lo, hi):
            kind, string, line = tokens[i]
            if kind != NAME or i == self.from_import:
                continue
            prev = tokens[i - 1][1] if i else ""
            nxt = tokens[i + 1][1] if i + 1 < n else ""
            if prev in ("def", "class"):
                bound.add(string)
                continue
            if prev == "." or (keyword.iskeyword(string) and string not in ("import", "from")):
                continue  # the middle of a dotted chain (handled from its root), or `return (`
            if string in ("import", "from"):
                # `import a.b as c, d` / `from a.b import ...`: the dotted names up to
                # `import`/`as`, on the statement's line (the tokens carry no NEWLINE: a name on
                # the next line starts another statement)
                j, parts = i + 1, []
                while j < n and tokens[j][2] == line:
                    s = tokens[j][1]
                    if s in ("import", "from", ";") or (string == "from" and s == "as"):
                        break       # the next statement (each token is walked once: linear)
                    if s == "," and string == "import":
                        imports.append(("".join(parts), line))
                        parts = []
                    elif s == "as":
                        imports.append(("".join(parts), line))
                        parts = []
                        j += 1      # the alias
                    elif tokens[j][0] == NAME or s == ".":
                        parts.append(s)
                    j += 1
                if parts:
                    imports.append(("".join(parts), line))
                if string == "from" and j < n and tokens[j][1] == "import":
                    self.from_import = j
                continue
            if nxt in ("=", ":", ",", ")") and prev in ("(", ",", "for", "as", "") or \
                    nxt in ("=", ":"):
                bound.add(string)  # assignment targets, parameters, loop and `as` names
            if prev in ("for", "as"):
                bound.add(string)
            j, parts = i, [string]
            while j + 2 < n and tokens[j + 1][1] == "." and tokens[j + 2][0] == NAME:
                parts.append(tokens[j + 2][1])
                j += 2
            if j + 1 < n and tokens[j + 1][1] == "(":
                calls.setdefault(".".join(parts), line)


def budgeted(ctx: "ScanContext", text: str, limit: int, rule: str, member: str | None,
             variant: str | None = None) -> str:
    """The part of a code text that is tokenized: at most ``limit`` characters, and no more
    than the file's remaining ``ctx.code_chars`` (so a file of many huge sources stays bounded
    in time); what is left out is reported under ``rule``, since it is not known to be safe."""
    allowed = min(limit, max(ctx.code_chars, 0))
    if len(text) > allowed:
        spent = f"the {context.CODE_CHARS_PER_FILE:,} characters of code one file may hold are spent"
        why = f"only the first {allowed:,} are read" if allowed == limit else \
            f"{allowed:,} are read ({spent})"
        ctx.add(rule, f"code of {len(text):,} characters: {why}", member, variant=variant)
        text = text[:text.rfind("\n", 0, allowed) + 1]
    ctx.code_chars -= len(text)
    return text


def check_code(ctx: "ScanContext", member: str, text: str) -> None:
    """Calls in a TorchScript ``code/`` file must stay within torch, ops and the builtins."""
    import tokenize
    text = budgeted(ctx, text, MAX_CODE_CHARS, "torchscript.code-unparseable", member)
    try:
        calls, bound, imports = _code_calls_and_bindings(_code_tokens(text))
    except (tokenize.TokenError, SyntaxError, ValueError, MemoryError, RecursionError) as e:
        ctx.add("torchscript.code-unparseable", f"code file does not tokenize: {e}", member)
        return
    for module, _line in imports:
        root = module.split(".")[0]
        if root and root not in _TS_SAFE_IMPORT_ROOTS:
            ctx.add("torchscript.foreign-call",
                    f"TorchScript code imports {module}: outside torch", member, None, module, "member",
                    variant="dangerous" if root in _TS_DANGER_ROOTS else None)
    seen = set()
    for dotted, line in calls:
        root = dotted.split(".")[0]
        if dotted in seen:
            continue
        if root in _TS_DANGER_ROOTS and root not in bound or dotted in _TS_FILE_CALLS or \
                dotted in ("torch.ops.load_library", "torch.classes.load_library"):
            seen.add(dotted)
            ctx.add("torchscript.foreign-call",
                    f"TorchScript code calls {dotted} (line {line})", member, None, dotted, "member",
                    variant="dangerous")
        elif root == "ops" and dotted.count(".") >= 2 and dotted.split(".")[1] not in _STANDARD_OP_NAMESPACES:
            seen.add(dotted)
            ctx.add("torchscript.custom-op",
                    f"TorchScript code calls custom operator {dotted} (line {line}): loading needs "
                    "its native library", member, None, dotted, "member")
        elif root not in bound and root not in _TS_OK_ROOTS:
            seen.add(dotted)
            ctx.add("torchscript.foreign-call",
                    f"TorchScript code calls {dotted} (line {line}): outside torch, ops and the "
                    "TorchScript builtins", member, None, dotted, "member")



# =================================================================================================
# Python sources in archives (TorchServe .mar handlers, torch.package modules)

# What ordinary handler and module code never does: run commands, evaluate or load code, open
# sockets, call native code, delete trees (a handler's os.path, open and torch.load are its job).
_SOURCE_DANGER_CALLS = ("os.system", "os.popen", "os.exec", "os.spawn", "os.posix_spawn",
                        "os.fork", "subprocess.", "pty.spawn", "eval", "exec", "compile",
                        "__import__", "ctypes.", "socket.", "marshal.load", "pickle.load",
                        "shutil.rmtree", "builtins.eval", "builtins.exec", "importlib.import_module",
                        "runpy.", "code.interact", "webbrowser.open", "urllib.request.urlopen")
_SOURCE_DANGER_IMPORTS = {"subprocess", "ctypes", "socket", "pty", "marshal", "runpy"}
# (blanks as [ \t]: a leading \s* under re.M would rescan every following empty line: O(n^2))
_FROM_OS_IMPORT = re.compile(r"^[ \t]*from[ \t]+os[ \t]+import\b([^\n]*)", re.M)
_OS_RUNNER = re.compile(r"\b(system|popen|exec\w*|spawn\w*)\b")   # searched in what it imports


def _dangerous_call(dotted: str) -> bool:
    return any(dotted == d or (d.endswith(".") and dotted.startswith(d)) or
               (d in ("os.exec", "os.spawn", "os.posix_spawn", "marshal.load", "pickle.load")
                and dotted.startswith(d)) for d in _SOURCE_DANGER_CALLS)


def source_dangers(text: str) -> list[tuple[str, str]]:
    """(trigger, what) for each thing a Python source does that ordinary model, handler and
    module code never does (`_SOURCE_DANGER_CALLS`, `_SOURCE_DANGER_IMPORTS`), at most 8. The
    text is tokenized, never compiled; raises tokenize.TokenError/SyntaxError/ValueError when it
    does not tokenize."""
    calls, bound, imports = _code_calls_and_bindings(_code_tokens(text))
    aliases = _import_aliases(text)
    hits: dict[str, str] = {}
    for module, line in imports:
        if module.split(".")[0] in _SOURCE_DANGER_IMPORTS:
            hits.setdefault(module, f"imports {module} (line {line})")
    for m in _FROM_OS_IMPORT.finditer(text):
        for name in _OS_RUNNER.findall(m.group(1)):
            hits.setdefault(f"os.{name}", f"imports os.{name}")
    for dotted, line in calls:
        root, dot, rest = dotted.partition(".")
        if root in aliases:     # `import os as o; o.system()`, `from os import popen; popen()`
            dotted = aliases[root] + dot + rest
        elif root in bound:
            continue
        if _dangerous_call(dotted):
            hits.setdefault(dotted, f"calls {dotted} (line {line})")
    return list(hits.items())[:8]


# (one greedy group per line and the words split in Python: no two quantifiers that can take the
# same blanks, which made a long line of spaces quadratic)
_IMPORT_AS = re.compile(r"^[ \t]*import[ \t]+([^\n#]*)", re.M)
_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+([\w.]+)[ \t]+import[ \t]+\(?([\w \t,]+)\)?", re.M)


def _import_aliases(text: str) -> dict[str, str]:
    """Local name -> dotted name it was imported as (``import a.b as c``: c -> a.b; ``from a
    import b as c``: c -> a.b; ``from a import b``: b -> a.b)."""
    aliases: dict[str, str] = {}
    for m in _IMPORT_AS.finditer(text):
        for part in m.group(1).split(","):
            words = part.split()
            if len(words) == 3 and words[1] == "as":
                aliases[words[2]] = words[0]
    for m in _FROM_IMPORT.finditer(text):
        module = m.group(1)
        if module.startswith("."):
            continue
        for part in m.group(2).split(","):
            words = part.split()
            if len(words) == 1:
                aliases[words[0]] = f"{module}.{words[0]}"
            elif len(words) == 3 and words[1] == "as":
                aliases[words[2]] = f"{module}.{words[0]}"
    return aliases


SOURCE_UNREADABLE = (SyntaxError, ValueError, MemoryError, RecursionError)   # + TokenError


def check_sources(ctx: "ScanContext", sources: list[tuple[str, str]]) -> None:
    """One finding for the archive's Python sources (imported by its loader: their code runs by
    design), and a critical one per source that runs commands, evaluates or loads code, opens
    sockets or calls native code (`source_dangers`)."""
    import tokenize
    if not sources:
        return
    names = ", ".join(member for member, _ in sources[:5]) + (" ..." if len(sources) > 5 else "")
    ctx.add("archive.python-source",
            f"{len(sources)} Python source file(s) ({names}): the archive's loader (TorchServe, "
            "torch.package) imports them and runs their code", sources[0][0])
    for member, text in sources:
        text = budgeted(ctx, text, MAX_CODE_CHARS, "archive.python-source", member, "dangerous")
        try:
            hits = source_dangers(text)
        except (tokenize.TokenError, *SOURCE_UNREADABLE) as e:
            ctx.add("archive.python-source", f"Python source does not tokenize ({e}): not read",
                    member, variant="dangerous")
            continue
        for trigger, what in hits:
            ctx.add("archive.python-source", f"Python source {what}: it runs when the loader "
                    "imports the module", member, None, trigger, "member", variant="dangerous")
