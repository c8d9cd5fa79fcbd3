"""Pickle rules: every stream in a byte range read as its loader reads it, judged by the policy
(`tensorscope.policy`), plus what the value tree says (embedded pickles carried as data, reference
bombs, keys the real loader rejects)."""
from __future__ import annotations

import base64
import binascii
import re

from .. import policy
from ..errors import FormatError
from .context import ScanContext, join
from .report import Severity
from .rules import severity_of

# =================================================================================================
# Pickle streams

def _looks_like_pickle(r) -> bool:
    return bool(r.stopped or r.globals or r.protocol is not None and r.opcodes > 2)


def vm_run(ctx: "ScanContext", data, start: int, member: str | None, base: int, joblib: bool = True):
    """One pickle as its loader reads it: joblib's array placeholders are followed by raw array
    bytes that joblib.load reads (parsers/joblib_arrays.py); ``joblib=False`` reads as pickle.load."""
    from ..parsers import joblib_arrays, pickle_vm
    kwargs = {} if ctx.vm_limits is None else {"limits": ctx.vm_limits}
    if joblib:
        kwargs["build_hooks"] = joblib_arrays.build_hooks(data)
    return pickle_vm.run(data, start=start, hooks=pickle_vm.CONTAINER_HOOKS, file=ctx.path,
                         member=member, base_offset=base, **kwargs)


def _check_joblib_bytes(ctx: "ScanContext", data, r, member: str | None, base: int,
                        offset_base: str) -> None:
    """A joblib file read by pickle.load instead: the inline array bytes become opcodes. Bytes
    crafted to import something dangerous that way hide from a joblib-only reading, so that
    reading is judged too (denied names only: real array bytes decode as junk, never as them)."""
    from ..parsers import joblib_arrays
    if not any((g.module, g.name) in joblib_arrays.ARRAY_WRAPPERS for g in r.globals):
        return
    seen = {g.pos for g in r.globals}
    plain = vm_run(ctx, data, 0, member, base, joblib=False)
    for g in plain.globals:
        v = policy.classify(g.module, g.name)
        if g.pos not in seen and v.category == policy.DENIED:
            ctx.add("pickle.dangerous-global",
                    f"read by pickle.load instead of joblib.load, the bytes after a joblib array "
                    f"placeholder are opcodes that import {v.dotted}: {v.reason}", member,
                    base + g.pos, v.dotted, offset_base)


_LONG_FRAME = re.compile(r"FRAME wants (\d+) bytes, (\d+) remain")


def _check_long_frame(ctx: "ScanContext", data, r, member: str | None, base: int,
                      offset_base: str) -> None:
    """A FRAME longer than the bytes left stops CPython's C unpickler (pickle.loads, torch.load)
    before the frame runs, but the pure-Python ``pickle._Unpickler`` -- what joblib.load reads
    with -- takes the short read as the frame and runs its opcodes. That reading is judged too:
    a payload behind a lying FRAME length would otherwise hide behind a mere parse error."""
    err = r.error
    m = _LONG_FRAME.match(getattr(err, "reason", "") or "")
    if m is None or getattr(err, "offset", None) is None or len(data) > ctx.limits.max_decompressed:
        return
    at = err.offset - base
    if not (0 <= at < len(data) - 9) or data[at] != 0x95:
        return
    patched = bytearray(data)
    patched[at + 1:at + 9] = (len(data) - at - 9).to_bytes(8, "little")
    plain = vm_run(ctx, patched, 0, member, base, joblib=False)
    for g in plain.globals:
        v = policy.classify(g.module, g.name)
        if v.category == policy.DENIED:
            ctx.add("pickle.dangerous-global",
                    f"behind a FRAME that claims {m.group(1)} bytes where {m.group(2)} remain "
                    f"(pickle.loads stops there, pickle._Unpickler and so joblib.load read the "
                    f"short frame and run it), the pickle imports {v.dotted}: {v.reason}",
                    member, base + g.pos, v.dotted, offset_base)


def scan_stream(ctx: "ScanContext", data, member: str | None, base: int, absolute: bool,
                      depth: int, lenient: bool, keys: set | None = None,
                      require_stop: bool = False) -> tuple[bool, bool]:
    """Read pickles from ``data[0]`` as loaders do. Returns (is a pickle, fully understood).

    ``lenient``: the content is expected to be a pickle (its name says so, or the user named it),
    so a broken first pickle still counts as one.
    """
    offset_base = "file" if absolute else "member"
    cached = ctx.reused.get((member, base))
    r = cached if cached is not None else vm_run(ctx, data, 0, member, base)
    if r.error is not None:
        _check_long_frame(ctx, data, r, member, base, offset_base)
    if require_stop and not r.stopped and any(
            policy.classify(g.module, g.name).category == policy.DENIED for g in r.globals[:64]):
        require_stop = False   # text that still imports a code-running global before it breaks
    if not _looks_like_pickle(r) or (require_stop and not r.stopped) or \
            (not lenient and not (r.stopped or r.globals)):
        if r.opcodes >= 1 and lenient and len(data) < (1 << 20) and r.error is not None and \
                plausible_start(data):
            # a pickle the VM cannot read at all: never clean
            ctx.fail(f"pickle{(' ' + member) if member else ''}: {r.error.reason if hasattr(r.error, 'reason') else r.error}")
            return True, False
        if lenient and member and member.lower().endswith(_NAMED_PICKLE):
            # the loader that reads this member by its name (pickle/joblib.load) would fail
            ctx.fail(f"member {member} is named as a pickle but does not parse as one")
            return True, False
        return False, True
    understood = True
    _check_joblib_bytes(ctx, data, r, member, base, offset_base)
    results = [(0, r)]
    from ..parsers.torch_legacy import MAGIC_NUMBER   # torch's legacy form: five pickles follow
    legacy = r.stopped and r.value == MAGIC_NUMBER
    pos = r.end
    n = 1
    if legacy:
        # torch's legacy stream: magic, protocol, sys_info, main, storage keys, then raw data.
        while n < 5 and r.stopped and pos < len(data):
            r = vm_run(ctx, data, pos, member, base)
            results.append((pos, r))
            pos = r.end
            n += 1
    else:
        while r.stopped and pos < len(data) and n < ctx.limits.max_streams:
            nxt = vm_run(ctx, data, pos, member, base)
            gap = 0
            if not _looks_like_pickle(nxt):
                hidden = _hidden_stream(ctx, data, pos, member, base)
                if hidden is None:
                    tail = len(data) - pos
                    if bytes(data[pos:pos + 64]).strip(b"\x00 \n\r\t"):
                        ctx.add("pickle.trailing-data",
                                f"{tail} bytes follow the pickle's STOP (pickle.load ignores them; "
                                "no pickle stream starts anywhere in them)", member, base + pos,
                                None, offset_base)
                    break
                gap, (pos, nxt) = hidden[0] - pos, hidden
            ctx.add("pickle.multiple-streams",
                    f"another pickle starts after STOP at byte {base + pos}"
                    + (f" (behind {gap} bytes of padding or separator)" if gap else "")
                    + ": pickle.load reads only the first, torch.load's legacy path and other "
                    "readers read on (scanned)", member, base + pos, None, offset_base)
            results.append((pos, nxt))
            r = nxt
            pos = r.end
            n += 1
    for start, res in results:
        ctx.judged.add((member, base + start))
        if not judge_result(ctx, res, member, base, offset_base, depth, keys=keys,
                             role="legacy" if legacy else "pickle"):
            understood = False
    return True, understood


# Where a pickle can start: PROTO 2..5, or a protocol 0/1 GLOBAL line ("cmodule\nname\n").
_STREAM_START = re.compile(rb"\x80[\x02-\x05]|c[A-Za-z_][\w.]{0,200}\n[A-Za-z_][\w.]{0,200}\n")
_HIDDEN_SEARCH = 16 << 20   # bytes of a tail searched for a stream start
_HIDDEN_TRIES = 64          # candidate starts run through the VM per tail


def _hidden_stream(ctx: "ScanContext", data, pos: int, member, base: int):
    """(start, result) of the first complete pickle that starts anywhere in ``data[pos:]`` (after
    a separator byte, padding or junk) and imports something, or None."""
    tail = bytes(data[pos:pos + _HIDDEN_SEARCH])
    for i, m in enumerate(_STREAM_START.finditer(tail)):
        if i >= _HIDDEN_TRIES:
            break
        r = vm_run(ctx, data, pos + m.start(), member, base)
        if r.stopped and (r.globals or r.calls):
            return pos + m.start(), r
    return None


_NAMED_PICKLE = (".pkl", ".pickle", ".joblib")


def plausible_start(data) -> bool:
    b = bytes(data[:2])
    return b[:1] == b"\x80" or b[:1] in (b"(", b"c", b"}", b"]", b")", b"\x95")


def judge_result(ctx: "ScanContext", r, member: str | None, base: int, offset_base: str, depth: int,
                  keys: set | None = None, role: str = "pickle") -> bool:
    """Findings for one VM result. Returns False when the pickle broke (partial results kept)."""
    from ..parsers.pickle_vm import DYNAMIC, Call, Global, PersistentRef
    out: list[tuple] = []

    # how each global is used: calls keyed by the Global object's position
    uses: dict[int, list] = {}
    module_calls: set[int] = set()
    # Calls of allowlisted plain callables (torch's rebuild functions, OrderedDict: one per tensor)
    # need no judging: they are set aside once, by the identity of their Global.
    plain: dict[int, bool] = {}
    to_judge = []
    mutated = []
    handed: list[tuple] = []   # (callee Global, the call that hands it, args it is called with)
    for c in r.calls:
        f = c.func
        if type(f) is Global:
            if c.opcode in _CONTAINER_OPS:
                mutated.append(c)   # BUILD/SETITEM on an imported object, not on one built here
                continue
            if f.name in _CALLS_ARGUMENT_NAMES:
                _handed_callables(c, handed)
            p = plain.get(id(f))
            if p is None:
                p = plain[id(f)] = _plain_callable(f.module, f.name)
            if p and (p is _REBUILD or not _bytes_arg(c.args)):
                continue
        to_judge.append(c)
    for c in to_judge:
        if c.opcode in _CONTAINER_OPS:
            continue
        f = c.func
        cls = _module_pid_class(f) if isinstance(f, PersistentRef) else None
        if cls is not None:
            # torch's legacy format saves a module class as the persistent id ('module', cls,
            # source_file, source); persistent_load returns cls and the pickle instantiates it.
            uses.setdefault(cls.pos, []).append(_Instantiate(c.pos))
            module_calls.add(id(c))
            continue
        if isinstance(f, Global):
            uses.setdefault(f.pos, []).append(c)
            if _call_facts(f.module, f.name)[0]:
                if c.args and isinstance(c.args[0], Global):
                    uses.setdefault(c.args[0].pos, []).append(_Instantiate(c.pos))

    # an allowlisted callable that calls what it is handed (_rebuild_from_type_v2 calls func(*args),
    # numpy's __generator_ctor calls bit_generator_ctor(name)): the handed global is called
    for g, carrier, args in handed:
        uses.setdefault(g.pos, []).append(_Handed(carrier.pos, args, carrier.func.dotted))

    # 1. globals
    per_name: dict[str, list] = {}
    for g in r.globals:
        if DYNAMIC in (g.module, g.name):
            out.append(("pickle.dynamic-global",
                        f"imports {g.module}.{g.name}: a name computed while loading (only running "
                        "the pickle would tell what it imports)", base + g.pos, None))
            continue
        v = policy.classify(g.module, g.name)
        if v.category == policy.ALLOWED:
            continue
        calls = uses.get(g.pos, [])
        at = base + g.pos
        if v.category == policy.DENIED:
            if calls and _is_loader(g.module, g.name):
                continue  # reported once, as the second stage it starts
            what = _usage_text(calls)
            out.append(("pickle.dangerous-global",
                        f"{'calls' if calls else 'imports'} {v.dotted}{what}: {v.reason}"
                        + (f" (written as {g.module} {g.name})" if v.dotted != f"{g.module}.{g.name}" else ""),
                        at, v.dotted))
            continue
        per_name.setdefault((v.category, v.dotted, v.reason), []).append((g, calls))
    for (category, dotted, reason), occurrences in per_name.items():
        g0 = occurrences[0][0]
        at = base + g0.pos
        times = f" ({len(occurrences)} times)" if len(occurrences) > 1 else ""
        calls = [c for _, cs in occurrences for c in cs]
        if category == policy.FRAMEWORK:
            out.append(("pickle.framework-class",
                        f"names {dotted}{times}: {reason}; known inert, but "
                        f"{_weights_only_hint(dotted)}", at, dotted))
            continue
        handed_to = next((c for c in calls if isinstance(c, _Handed)), None)
        family = policy.library_of(dotted)
        string_call = next((c for c in calls if not isinstance(c, _Instantiate) and _has_string(c)), None)
        evidence = (f" (handed to {handed_to.carrier}, which calls it"
                    f"{_usage_text([handed_to])})") if handed_to is not None else ""
        if family is not None and handed_to is None and _value_class_use(dotted, calls):
            # Enum members, dtypes and value classes of a known library: Cls('steps')
            out.append(("pickle.library-class",
                        f"loading builds {dotted}{_usage_text(calls[:1]) if calls else ''}{times}, "
                        f"{_class_family(dotted, calls)} of {family}: its code runs, none the file "
                        f"wrote; {_weights_only_hint(dotted)}",
                        at, dotted))
        elif string_call is not None:
            out.append(("pickle.unknown-call-string",
                        f"calls {dotted} (outside the allowlist"
                        + (f", code of {family}" if family else "") + ") with a string from the file"
                        f"{_usage_text([string_call])}{times}{evidence}", base + string_call.pos,
                        dotted))
        elif family is None and calls and \
                all(isinstance(c, _Instantiate) or not c.args and not c.kwargs for c in calls):
            out.append(("pickle.user-class",
                        f"loading imports user code: {dotted} is instantiated{times} (a class "
                        f"outside torch and the allowlist); {_weights_only_hint(dotted)}", at,
                        dotted))
        elif calls:
            out.append(("pickle.unknown-call",
                        f"calls {dotted} (outside the allowlist"
                        + (f", code of {family}" if family else "") + ")"
                        f"{_usage_text(calls[:1]) if handed_to is None else ''}{times}{evidence}",
                        base + calls[0].pos, dotted))
        elif family is None:
            out.append(("pickle.user-class",
                        f"loading imports user code: module {dotted.rsplit('.', 1)[0]} is imported "
                        f"for {dotted}{times} (its top-level code runs on import); "
                        f"{_weights_only_hint(dotted)}", at, dotted))
        else:
            out.append(("pickle.unknown-import",
                        f"imports {dotted} (code of {family}, not known inert) without calling "
                        f"it{times}: {_weights_only_hint(dotted)}", at, dotted))

    # only a pickle that imports something that makes size (range, bytes, repeat, mul, pow ...)
    # can be a resource bomb: the pass over every call (one per tensor) is skipped otherwise
    if any(g.name in _BOMB_MAKERS and g.module in _BOMB_MODULES for g in r.globals):
        out.extend(_resource_bombs(r.calls, base))
    for c in mutated[:_MUTATION_CAP]:
        g = c.func
        out.append(("pickle.global-mutation",
                    f"{c.opcode} writes into the imported object {g.dotted} (no writer does: they "
                    "fill objects the pickle built): a monkeypatch that outlives the load "
                    "(copyreg's extension registry, a class's methods, a function's attributes)",
                    base + c.pos, policy.classify(g.module, g.name).dotted))
    for at, what in r.reader_disagreements:
        out.append(("pickle.reader-disagreement",
                    f"CPython's readers disagree on these bytes ({what}): opcodes can hide from "
                    "this scan's reading", base + at, None))

    # 2. calls of things that are not globals; second stages
    for c in to_judge:
        f = c.func
        if c.opcode in _CONTAINER_OPS or id(c) in module_calls:
            continue
        if isinstance(f, Call):
            inner = f.func.dotted if isinstance(f.func, Global) else type(f.func).__name__
            out.append(("pickle.indirect-call",
                        f"calls the result of another call ({inner}(...)(...)): a gadget chain",
                        base + c.pos, inner))
        elif not isinstance(f, Global):
            out.append(("pickle.indirect-call",
                        f"calls a {type(f).__name__} object pushed by the pickle itself", base + c.pos,
                        None))
        if isinstance(f, Global):
            _, loader, dotted = _call_facts(f.module, f.name)
            if loader:
                payloads = [p for p in (_unwrap_bytes(a) for a in c.args) if p]
                findings_before, failures_before = len(ctx.findings), len(ctx.failures)
                for p in payloads:
                    scan_second_stage(ctx, p, member, c.pos, depth)
                inner_clean = bool(payloads) and len(ctx.failures) == failures_before and all(
                    x.severity <= Severity.INFO for x in ctx.findings[findings_before:])
                if dotted == "torch.storage._load_from_bytes" and inner_clean:
                    # What torch itself writes for pickle.dumps(tensor) (Storage.__reduce__): the
                    # nested torch.load runs a checkpoint we scanned completely and found clean.
                    out.append(("pickle.torch-storage-bytes",
                                f"torch's own tensor pickling: hands a {len(payloads[0])}-byte legacy "
                                f"checkpoint to {dotted} (torch.load without weights_only); that "
                                "checkpoint was scanned and is clean", base + c.pos, dotted))
                    continue
                out.append(("pickle.second-stage",
                            f"hands {'a ' + str(len(payloads[0])) + '-byte payload' if payloads else 'data'} "
                            f"to {dotted}: a second stage"
                            + (" (scanned too)" if payloads else ""), base + c.pos, dotted))
                continue
        for a in c.args if isinstance(c.args, tuple) else ():
            if isinstance(a, (bytes, bytearray)) and len(a) >= 8 and a[:1] == b"\x80" and a[1:2] and a[1] <= 5:
                scan_second_stage(ctx, bytes(a), member, c.pos, depth)

    # 3. persistent ids (torch storages) -> keys of records (data/K, constants/K,
    # traced_inputs/K) that torch reads as raw bytes
    if keys is not None:
        keys.update(str(pid[2]) for pid, _pos in r.persistent_ids
                    if type(pid) is tuple and len(pid) >= 3 and pid[0] == "storage")

    # 4. a broken pickle: what ran before the break counts
    ok = True
    if r.error is not None:
        ok = False
        err = r.error
        reason = getattr(err, "reason", str(err))
        at = getattr(err, "offset", None)
        out.append(("pickle.parse-error",
                    f"the pickle breaks ({reason}); a loader runs every opcode before the break, "
                    f"so the {len(r.globals)} globals and {len(r.calls)} calls before it are reported",
                    at if at is not None else base + r.end, None))
    elif not r.stopped:
        ok = False
        out.append(("pickle.parse-error", "the pickle ends without STOP",
                    base + r.end, None))

    if r.value is not None:
        out.extend(_value_findings(ctx, r.value, member, depth))
    cap = ctx.limits.max_findings_per_pickle
    listed: dict[str, int] = {}
    for rule, msg, at, trig in out:
        n = listed[rule] = listed.get(rule, 0) + 1
        if n <= cap:
            ctx.add(rule, msg, member, at, trig, offset_base)
    for rule, n in listed.items():
        if n > cap:
            ctx.add("pickle.findings-capped", f"{n - cap} more {rule} findings in this pickle "
                    "(not listed)", member, None, None, offset_base, variant=str(severity_of(rule)))
    return ok


# =================================================================================================
# Denial of service through allowlisted builtins: judged by the work or memory a call would cause

_WORK_LIMIT = 10 ** 8          # elements a load would iterate over
_MEMORY_LIMIT = 1 << 31        # bytes a load would allocate
_BOMB_MODULES = frozenset({"builtins", "__builtin__", "operator", "_operator", "itertools",
                           "collections", "math", "numpy", "_codecs", "codecs"})
# Callables that iterate over their whole argument (or build a container from it).
_CONSUMERS = frozenset({"builtins.sum", "builtins.min", "builtins.max", "builtins.sorted",
                        "builtins.list", "builtins.tuple", "builtins.set", "builtins.frozenset",
                        "builtins.all", "builtins.any", "builtins.bytes", "builtins.bytearray",
                        "builtins.dict", "builtins.str.join", "builtins.bytes.join",
                        "collections.Counter", "collections.deque", "collections.OrderedDict",
                        "math.prod", "math.fsum", "numpy.array", "numpy.fromiter"})
_BOMB_MAKERS = frozenset({"range", "bytes", "bytearray", "repeat", "count", "mul", "imul", "__mul__",
                          "pow", "ipow", "lshift", "ilshift"})
_REPEATERS = frozenset({"operator.mul", "operator.imul", "operator.__mul__", "operator.repeat"})


def _dotted_call(c) -> str | None:
    from ..parsers.pickle_vm import Global
    f = c.func
    if type(f) is not Global or f.module not in _BOMB_MODULES:
        return None
    return ".".join(policy.normalize(f.module, f.name)).replace("_operator.", "operator.")


def _elements(v, depth: int = 0):
    """How many elements iterating ``v`` yields, when the pickle built it lazily (a range, an
    itertools.repeat/count); None when unknown or small."""
    from ..parsers.pickle_vm import Call
    if depth > 4 or type(v) is not Call:
        return None
    d = _dotted_call(v)
    args = v.args if type(v.args) is tuple else ()
    ints = [a for a in args if type(a) is int]
    if d == "builtins.range" and len(ints) == len(args) and 1 <= len(args) <= 3:
        start, stop, step = (0, ints[0], 1) if len(ints) == 1 else (ints + [1])[:3]
        if step == 0:
            return None
        return max(0, (stop - start + step - (1 if step > 0 else -1)) // step)
    if d == "itertools.repeat" and len(args) == 2 and type(args[1]) is int:
        return max(0, args[1])
    if d == "itertools.count":
        return float("inf")
    if d in ("builtins.reversed", "builtins.enumerate", "builtins.iter") and args:
        return _elements(args[0], depth + 1)
    return None


def _resource_bombs(calls, base: int) -> list[tuple]:
    out = []
    for c in calls:
        if len(out) >= 16:
            break
        d = _dotted_call(c)
        if d is None:
            continue
        args = c.args if type(c.args) is tuple else ()
        what = None
        if d in ("builtins.bytes", "builtins.bytearray") and len(args) == 1 and \
                type(args[0]) is int and args[0] >= _MEMORY_LIMIT:
            what = f"allocates {_approx(args[0])} bytes ({d}({_approx(args[0])}))"
        elif d in _CONSUMERS and args:
            n = _elements(args[0])
            if n is not None and n >= _WORK_LIMIT:
                what = (f"iterates over {'an endless iterator' if n == float('inf') else _approx(n) + ' elements'}"
                        f" ({d}({short_repr(args[0])}))")
        elif d in _REPEATERS and len(args) == 2:
            seq, n = (args if type(args[1]) is int else args[::-1])
            if type(n) is int and isinstance(seq, (str, bytes, tuple, list)) and \
                    len(seq) * n >= _MEMORY_LIMIT:
                what = f"builds a sequence of {_approx(len(seq) * n)} items ({d} of {len(seq)} by {_approx(n)})"
        elif d in ("operator.pow", "operator.ipow", "builtins.pow", "operator.lshift",
                   "operator.ilshift") and len(args) >= 2 and all(type(a) is int for a in args[:2]):
            a, b = args[0], args[1]
            bits = b if "shift" in d else (b * max(1, abs(a).bit_length()) if b > 0 else 0)
            if bits >= 8 * _MEMORY_LIMIT:
                what = f"computes an integer of about {_approx(bits // 8)} bytes ({d}({a}, {_approx(b)}))"
        if what is not None:
            out.append(("pickle.resource-bomb",
                        f"loading {what}: every callable involved may be on the allowlist, and the "
                        "load never finishes or exhausts memory (denial of service)",
                        base + c.pos, d))
    return out


_REBUILD = "rebuild"  # a truthy marker: torch's rebuild functions and OrderedDict, one per tensor


def _plain_callable(module, name):
    """An allowlisted global that neither constructs by its argument nor loads bytes: False, True,
    or `_REBUILD` for the per-tensor callables whose arguments are storage references, integers,
    shape tuples and dicts (never raw bytes; the torch parser checks them)."""
    transparent, loader, _ = _call_facts(module, name)
    if transparent or loader or policy.classify(module, name).category != policy.ALLOWED:
        return False
    return _REBUILD if module == "torch._utils" or (module, name) == ("collections", "OrderedDict") \
        else True


def _bytes_arg(args) -> bool:
    """Whether a call's arguments hold bytes that could be an inline pickle (scanned in step 2)."""
    if type(args) is not tuple:
        return False
    for a in args:
        if type(a) is bytes or type(a) is bytearray:
            return True
    return False


def _is_loader(module: str, name: str) -> bool:
    return _call_facts(module, name)[1]


_MUTATION_CAP = 16   # global-mutation findings per pickle (each one is already CRITICAL)
# Opcodes recorded as calls that only fill containers (no callable runs).
_CONTAINER_OPS = frozenset({"BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS"})
_COPYREG_CONSTRUCTORS = (("copyreg", "_reconstructor"), ("copyreg", "__newobj__"),
                         ("copyreg", "__newobj_ex__"))
_FACTS: dict[tuple, tuple[bool, bool, str]] = {}


def _call_facts(module, name) -> tuple[bool, bool, str]:
    """(transparent constructor, loader, normalised dotted name) of a called global; memoised,
    since a checkpoint calls the same few rebuild functions thousands of times."""
    key = (module, name)
    try:
        hit = _FACTS.get(key)
    except TypeError:  # an unhashable name (never from our VM; be safe)
        hit, key = None, None
    if hit is not None:
        return hit
    norm = policy.normalize(module, name)
    dotted = ".".join(norm)
    transparent = f"{module}.{name}" in policy.TRANSPARENT_CONSTRUCTORS or \
        norm in _COPYREG_CONSTRUCTORS
    loader = dotted in policy.LOADER_CALLS or f"{module}.{name}" in policy.LOADER_CALLS or \
        dotted.replace("_pickle.", "pickle.", 1) in policy.LOADER_CALLS
    hit = (transparent, loader, dotted)
    if key is not None:
        if len(_FACTS) >= 4096:  # hostile pickles name many globals: keep the memo bounded
            _FACTS.clear()
        _FACTS[key] = hit
    return hit


def _module_pid_class(f):
    from ..parsers.pickle_vm import Global, PersistentRef
    if isinstance(f, PersistentRef) and isinstance(f.pid, tuple) and len(f.pid) >= 2 and \
            f.pid[0] in ("module", b"module") and isinstance(f.pid[1], Global):
        return f.pid[1]
    return None


# Allowlisted or known-inert callables that call an argument: dotted -> (index of the callable,
# how the args it is called with are found). torch/_tensor.py _rebuild_from_type_v2(func,
# new_type, args, state) runs func(*args); numpy/random/_pickle.py __generator_ctor(name, ctor)
# and __randomstate_ctor(name, ctor) run ctor(name).
_CALLS_ARGUMENT: dict[str, tuple[int, str]] = {
    "torch._tensor._rebuild_from_type_v2": (0, "args2"),
    "numpy.random._pickle.__generator_ctor": (1, "arg0"),
    "numpy.random._pickle.__randomstate_ctor": (1, "arg0"),
}
_CALLS_ARGUMENT_NAMES = frozenset(k.rsplit(".", 1)[1] for k in _CALLS_ARGUMENT)
_BENIGN_HANDED = frozenset({"numpy.random._pickle.__bit_generator_ctor", "torch._utils._rebuild_tensor_v2",
                            "torch._utils._rebuild_parameter", "torch._utils._rebuild_tensor"})


def _handed_callables(c, out: list) -> None:
    from ..parsers.pickle_vm import Global
    f = c.func
    spec = _CALLS_ARGUMENT.get(f"{policy.normalize(f.module, f.name)[0]}.{f.name}")
    if spec is None or type(c.args) is not tuple or len(c.args) <= spec[0]:
        return
    g = c.args[spec[0]]
    if not isinstance(g, Global) or f"{g.module}.{g.name}" in _BENIGN_HANDED:
        return
    if spec[1] == "args2":
        args = c.args[2] if len(c.args) > 2 and type(c.args[2]) is tuple else ()
    else:
        args = c.args[:1]
    out.append((g, c, args))


class _Handed:
    """A global handed to a callable that calls it (see _CALLS_ARGUMENT)."""

    __slots__ = ("pos", "args", "carrier")
    kwargs = None

    def __init__(self, pos: int, args: tuple, carrier: str):
        self.pos, self.args, self.carrier = pos, args, carrier


def _weights_only_hint(dotted: str) -> str:
    """What a weights-only load does with a global outside its allowlist, and the safe way."""
    short = dotted.rsplit(".", 1)[-1]
    return (f"torch.load(weights_only=True) refuses it; load safely with "
            f"torch.serialization.safe_globals([{short}]) once you trust it, or keep tensors only")


def _value_class_use(dotted: str, calls) -> bool:
    """The use of a library class that builds a value: imported, instantiated, or called with one
    scalar (an Enum member ``IntervalStrategy('steps')``, a dtype ``StringDtype('python')``)."""
    last = dotted.rsplit(".", 1)[-1]
    if not last.lstrip("_")[:1].isupper() and not last.startswith(("_new_", "_unpickle", "__pyx_unpickle")):
        return False
    for c in calls:
        if isinstance(c, _Instantiate):
            continue
        args = c.args if type(c.args) is tuple else ()
        if c.kwargs or len(args) > 4:
            return False
        # a value class takes scalars (IntervalStrategy('steps'), StringDtype('python', nan))
        if not all(a is None or type(a) in (str, int, float, bool) for a in args) and \
                any(isinstance(a, str) for a in args) and \
                not last.startswith(("_new_", "_unpickle", "__pyx_unpickle")):
            return False
    return True


def _class_family(dotted: str, calls) -> str:
    last = dotted.rsplit(".", 1)[-1]
    one = [c for c in calls if not isinstance(c, _Instantiate) and type(c.args) is tuple
           and len(c.args) == 1 and isinstance(c.args[0], (str, int))]
    if one and len(one) == len(calls) and not last.startswith("_"):
        return "an Enum member or value class"
    if "Dtype" in last or "DType" in last:
        return "a dtype"
    if last.startswith(("_new_", "_unpickle", "__pyx_unpickle")):
        return "a reconstructor"
    return "a class"


class _Instantiate:
    """A use of a class through copyreg._reconstructor / __newobj__ (an instantiation)."""

    __slots__ = ("pos",)
    args = ()
    kwargs = None

    def __init__(self, pos: int):
        self.pos = pos


def _has_string(c) -> bool:
    def walk(v, depth=0):
        if depth > 4:
            return False
        if isinstance(v, str):
            return True
        if isinstance(v, (tuple, list)):
            return any(walk(x, depth + 1) for x in v[:64])
        return False
    return walk(c.args) or bool(c.kwargs and walk(tuple(c.kwargs.values())))


def _usage_text(calls) -> str:
    for c in calls:
        if isinstance(c, _Instantiate):
            return " (instantiated)"
        if isinstance(c, _Handed):
            return f" with ({', '.join(short_repr(a) for a in c.args[:3])})"
        parts = []
        for a in (c.args if isinstance(c.args, tuple) else ())[:3]:
            parts.append(short_repr(a))
        return f"({', '.join(parts)}{', ...' if len(c.args) > 3 else ''})"
    return ""


def short_repr(v) -> str:
    if isinstance(v, (str, bytes, int, float, bool)) or v is None:
        s = repr(v)
    else:
        s = type(v).__name__ if not hasattr(v, "dotted") else v.dotted
        if type(v).__name__ == "Call":
            f = v.func
            s = f"{getattr(f, 'dotted', type(f).__name__)}(...)"
    return s if len(s) <= 60 else s[:57] + "..."


def _unwrap_bytes(v, depth: int = 0) -> bytes | None:
    """The bytes a loader would read from an argument: plain bytes, or bytes behind wrappers
    (``io.BytesIO(...)``, ``_codecs.encode(s, 'latin1')``, ``base64.b64decode(...)``)."""
    from ..parsers import compression
    from ..parsers.pickle_vm import Call, Global
    if depth > 6:
        return None
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, str):
        return v.encode("latin-1", "replace")
    if isinstance(v, Call) and isinstance(v.func, Global) and v.args:
        dotted = ".".join(policy.normalize(v.func.module, v.func.name))
        inner = _unwrap_bytes(v.args[0], depth + 1)
        if inner is None:
            return None
        try:
            if "b64decode" in dotted or "decodebytes" in dotted or "a2b_base64" in dotted:
                return base64.b64decode(inner, validate=False)
            if "b85decode" in dotted:
                return base64.b85decode(inner)
            if "a85decode" in dotted:
                return base64.a85decode(inner)
            if "b32decode" in dotted:
                return base64.b32decode(inner)
            if "unhexlify" in dotted or "a2b_hex" in dotted:
                return binascii.unhexlify(inner)
            if dotted in ("zlib.decompress", "gzip.decompress", "bz2.decompress", "lzma.decompress"):
                kind = {"lzma": "xz", "gzip": "gzip"}.get(dotted.split(".")[0], dotted.split(".")[0])
                return compression.decompress(inner, kind, cap=64 << 20)
            if dotted in ("codecs.decode",) and len(v.args) > 1 and "base64" in str(v.args[1]):
                return base64.b64decode(inner, validate=False)
        except (ValueError, binascii.Error, FormatError):
            return None
        return inner
    return None


def scan_second_stage(ctx: "ScanContext", payload: bytes, member: str | None, pos: int, depth: int) -> None:
    if depth + 1 > ctx.limits.max_depth:
        ctx.add("file.unparseable", "second stages nest deeper than the scan limit",
                member, pos, base="member")
        return
    name = join(member, f"<second stage at byte {pos}>")
    ctx.rescan(payload, name, depth + 1)




# =================================================================================================
# What the value tree says: embedded pickles, reference bombs, keys the real loader rejects

_BOMB_ELEMENTS = 10 ** 8      # materialised elements past which shared references are a bomb
_WALK_NODES = 32_768          # distinct containers visited per pickle (bounded work and memory)
_CANDIDATES = 64              # embedded payloads tried per pickle
_B64 = re.compile(rb"[A-Za-z0-9+/]{16,}={0,2}\s*")
_HEX = re.compile(rb"(?:[0-9a-fA-F]{2}){8,}")


def _value_findings(ctx: "ScanContext", value, member, depth: int) -> list[tuple]:
    """Findings from the inert value a pickle returns (see the rules pickle.reference-bomb,
    pickle.loader-rejects, data.embedded-pickle)."""
    size, distinct, unhashable, candidates = _walk_value(value)
    out: list[tuple] = []
    if size >= _BOMB_ELEMENTS:
        out.append(("pickle.reference-bomb",
                    f"shared references expand to {_approx(size)} elements from {distinct} distinct "
                    "containers: copying, printing or re-pickling the loaded object materialises "
                    "them all", None, None))
    if unhashable:
        out.append(("pickle.loader-rejects",
                    f"a dict key or set item is an unhashable {unhashable}: CPython's unpickler "
                    "raises TypeError there", None, None))
    for where, payload in candidates:
        out.extend(embedded_payload(ctx, payload, member, where, depth))
    return out


def embedded_payload(ctx: "ScanContext", blob, member, where: str, depth: int) -> list[tuple]:
    """A bytes/text value that may hold a pickle (raw, base64, hex): when it decodes to a complete
    pickle, one data.embedded-pickle finding, and the payload is scanned like a second stage."""
    if len(blob) > ctx.limits.max_decompressed:
        return []   # larger than any payload the scan would decompress: raw data, not read twice
    raw = blob.encode("latin-1", "replace") if isinstance(blob, str) else bytes(blob)
    for how, payload in _decodings(raw):
        if not _looks_pickled(payload):
            continue
        r = vm_run(ctx, payload, 0, member, 0)
        if not (r.stopped and r.opcodes > 1):
            continue
        if depth + 1 > ctx.limits.max_depth:
            return [("file.unparseable", "embedded pickles nest deeper than the scan limit", None, None)]
        name = join(member, f"<embedded pickle in {where}>")
        ctx.rescan(payload, name, depth + 1)
        return [("data.embedded-pickle",
                  f"{where} holds a complete {len(payload)}-byte pickle ({how}): loading this file "
                  "does not run it, a consumer that unpickles the value does (scanned, findings "
                  "under the member " + name + ")", None, None)]
    return []


def _decodings(raw: bytes):
    yield "raw bytes", raw
    stripped = raw.strip()
    if _HEX.fullmatch(stripped):
        try:
            yield "hex text", binascii.unhexlify(stripped)
        except (binascii.Error, ValueError):
            pass
    elif _B64.fullmatch(stripped) or _B64.fullmatch(stripped.replace(b"\n", b"")):
        try:
            yield "base64 text", base64.b64decode(stripped, validate=False)
        except (binascii.Error, ValueError):
            pass


def _looks_pickled(b: bytes) -> bool:
    """A pickle's first and last opcodes: PROTO 2..5 (or a protocol 0/1 opener) and STOP."""
    if len(b) < 4 or b[-1:] != b".":
        return False
    return (b[0] == 0x80 and 2 <= b[1] <= 5) or b[:1] in (b"c", b"(", b"}", b"]", b"\x8c", b"X")


def _approx(n: int) -> str:
    return f"{n:,}" if n < 10 ** 12 else f"about 2^{n.bit_length() - 1}"


def _walk_value(root):
    """(materialised element count, distinct containers, type of an unhashable key or None,
    [(where, bytes-or-str payload candidate)]).

    Shared containers are counted once per reference (what a copy or repr builds), computed over
    the DAG with a memo, so the walk itself costs one visit per distinct container; objects the
    parsers made (tensor references) and atoms are leaves. Calls to torch's rebuild functions are
    leaves too: their arguments are storage references, integers and shape tuples that the torch
    parser checks. Only values are payload candidates, never dict keys (tensor names)."""
    from ..parsers.pickle_vm import BuildStates, Call, Global, UnhashableKey
    containers = (dict, list, tuple, set, frozenset, Call, UnhashableKey)
    sizes: dict[int, int] = {}
    unhashable = None
    candidates: list[tuple[str, object]] = []
    visited = 0
    on_path: set[int] = set()
    stack: list = [(root, None, 0)]

    def value(v, where, kids):
        """Classify one child in value position: 1 if a leaf, 0 if pushed as a container.
        ``where`` is a label, or a 1-tuple holding the dict key the value sits under."""
        t = type(v)
        if t is str or t is bytes or t is bytearray:
            if len(v) >= 16 and len(candidates) < _CANDIDATES:
                if type(where) is tuple:
                    where = f"the value of key {short_repr(where[0])}"
                candidates.append((where, v))
            return 1
        if isinstance(v, containers):
            kids.append(v)
            return 0
        return 1

    while stack:
        node, kids, atoms = stack.pop()
        if kids is not None:   # post-visit: every child's size is known
            total = 1 + atoms
            for k in kids:
                total += sizes.get(id(k), 1)
            sizes[id(node)] = total
            on_path.discard(id(node))
            continue
        key = id(node)
        if key in sizes or key in on_path or not isinstance(node, containers):
            continue
        visited += 1
        if visited > _WALK_NODES:
            break
        kids = []
        atoms = 0
        t = type(node)
        if t is dict or isinstance(node, dict):
            for k, v in node.items():
                if type(k) is UnhashableKey:
                    unhashable = unhashable or type(k.value).__name__
                    kids.append(k)
                elif type(k) is tuple:
                    kids.append(k)
                else:
                    atoms += 1
                atoms += value(v, (k,), kids)
        elif t is UnhashableKey:
            atoms += value(node.value, "a dict key", kids)
        elif t is Call:
            f = node.func
            if isinstance(f, Global) and f.module == "torch._utils":
                sizes[key] = 1
                continue
            where = f"an argument of {getattr(f, 'dotted', type(f).__name__)}"
            for v in node.args if isinstance(node.args, tuple) else ():
                atoms += value(v, where, kids)
            for v in (node.kwargs or {}).values():
                atoms += value(v, where, kids)
            if isinstance(node.state, (dict, list, tuple, BuildStates)):
                kids.append(node.state)
            for v in node.items:
                atoms += value(v, "a list item", kids)
            for k, v in node.dictitems:
                if type(k) is UnhashableKey:
                    unhashable = unhashable or type(k.value).__name__
                atoms += 1
                atoms += value(v, (k,), kids)
            for v in node.setitems:
                atoms += value(v, "a set item", kids)
        else:  # list, tuple, set, frozenset, BuildStates
            for v in node:
                if type(v) is UnhashableKey:
                    unhashable = unhashable or type(v.value).__name__
                atoms += value(v, "a list item", kids)
        on_path.add(key)
        stack.append((node, kids, atoms))
        for k in reversed(kids):
            stack.append((k, None, 0))
    return sizes.get(id(root), 1), visited, unhashable, candidates
