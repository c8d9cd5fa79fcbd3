"""Reading repeated layers as groups: ``model.layers.#.mlp.experts.#.up_proj.weight ×15,360``.

Real checkpoints name tensors by flat dotted keys (``model.layers.3.mlp.up_proj.weight``), so the
components are the name split on ``.`` — and, for nested containers whose keys hold dots, the
saved path's components split the same way. Every all-digit component is an index and becomes
``#``. `inspect --group`, `diff --by layer|module` and the TUI share these functions, so one name
groups the same way everywhere.
"""
from __future__ import annotations

import re
from operator import itemgetter
from typing import Any

from .native import optional_extension

__all__ = ["components", "group_key", "group_indices", "index_ranges", "range_labels",
           "describe_ranges", "layer_key", "module_key", "GroupCollector"]


def components(name: str, path: tuple[str, ...] = ()) -> tuple[str, ...]:
    """A tensor's name components: ``path`` entries (nested containers) each split on ``.``."""
    parts = path if path else (name,)
    if len(parts) == 1:
        return tuple(parts[0].split("."))
    out: list[str] = []
    for p in parts:
        out.extend(p.split("."))
    return tuple(out)


# An all-digit (ASCII) component, in a name given a leading dot: a dot, digits, then the end
# or a dot. One regex call per name instead of a loop over its components (10^5-10^6 names per
# checkpoint); the literal dot lets the regex engine skip to candidates (1.6x faster than
# look-behind for "start or dot").
_INDEX = re.compile(r"\.([0-9]+)(?![^.])")


def _dotted(name: str, path: tuple[str, ...]) -> str:
    """``.`` and the components joined by dots (what `components` splits)."""
    return "." + (".".join(path) if len(path) > 1 else (path[0] if path else name))


def _split(name: str, path: tuple[str, ...]) -> list[str]:
    """[text, index, text, index, ..., text]; the texts keep no dot next to an index."""
    return _INDEX.split(_dotted(name, path))


def group_key(name: str, path: tuple[str, ...] = ()) -> str:
    """``model.layers.3.mlp.experts.17.up_proj.weight`` -> ``model.layers.#.mlp.experts.#.up_proj.weight``."""
    return ".#".join(_split(name, path)[::2])[1:]


def pattern_of(t) -> str:
    """The pattern `GroupCollector` files a `TensorInfo` under (its path's dotted text)."""
    path = t.path
    return _pattern(path[0] if len(path) == 1 else (".".join(path) if path else t.name))[0]


def group_indices(name: str, path: tuple[str, ...] = ()) -> tuple[int, ...]:
    """The numeric components of a name, in order (``(3, 17)`` for the example above)."""
    return tuple(map(int, _split(name, path)[1::2]))


def index_ranges(indices: list[tuple[int, ...]]) -> list[tuple[int, int, int]]:
    """Per ``#`` position over a group's members: (lowest, highest, distinct values seen)."""
    if not indices:
        return []
    out = []
    for pos in range(min(len(i) for i in indices)):
        seen = {i[pos] for i in indices}
        out.append((min(seen), max(seen), len(seen)))
    return out


def range_labels(pattern: str) -> list[str]:
    """What each ``#`` of a pattern counts: the component before it (``layers``, ``experts``), or
    ``#1``, ``#2``... where an index follows another index or opens the name."""
    parts = pattern.split(".")
    out = []
    for i, c in enumerate(parts):
        if c == "#":
            before = parts[i - 1] if i else ""
            out.append(before if before and before != "#" else f"#{len(out) + 1}")
    return out


def describe_ranges(pattern: str, ranges) -> str:
    """``layers 0–59, experts 0–255`` for a group's (lowest, highest, distinct) per ``#``; a
    range with holes says how many values were seen (``layers 0–59 (12 seen)``)."""
    out = []
    for label, (lo, hi, distinct) in zip(range_labels(pattern), ranges):
        text = f"{label} {lo}" if lo == hi else f"{label} {lo}–{hi}"
        if distinct != hi - lo + 1:
            text += f" ({distinct} seen)"
        out.append(text)
    return ", ".join(out)


def layer_key(name: str, path: tuple[str, ...] = ()) -> str:
    """The layer a tensor belongs to: its name up to the first index (``model.layers.3``); a tensor
    outside any indexed block is its own module (``model.embed_tokens`` for
    ``model.embed_tokens.weight``)."""
    parts = components(name, path)
    for i, c in enumerate(parts):
        if c.isdigit() and c.isascii():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) if len(parts) > 1 else parts[0]


def module_key(name: str, path: tuple[str, ...] = ()) -> str:
    """The kind of module a tensor belongs to, across layers: the name after its layer index, inner
    indices as ``#``, without the parameter leaf (``model.layers.3.self_attn.q_proj.weight`` ->
    ``self_attn.q_proj``; ``model.layers.3.mlp.experts.17.up_proj.weight`` -> ``mlp.experts.#.up_proj``);
    outside indexed blocks, the module itself (``model.embed_tokens``)."""
    parts = components(name, path)
    first = next((i for i, c in enumerate(parts) if c.isdigit() and c.isascii()), None)
    tail = parts[first + 1:] if first is not None else parts
    if len(tail) > 1:
        tail = tail[:-1]
    if not tail:
        return ".".join(parts)
    return ".".join("#" if c.isdigit() and c.isascii() else c for c in tail)


# Names with the same skeleton (every ASCII digit turned into NUL: one C call on an ASCII name's
# bytes, 10x faster than the regex) have their index components at the same offsets, read with
# one itemgetter of slices. Their pattern is the same too, except for the digits that are not an
# index (``layer1``, ``conv2``, ``w0``): those are part of the pattern, so a skeleton whose names
# have such digits keeps one pattern per value of them (``literals``). Other names (non-ASCII,
# or holding NUL themselves) take the regex.
_DIGITS_TO_NUL = bytes.maketrans(b"0123456789", b"\0" * 10)
_SKELETONS: dict[bytes, tuple[Any, Any, dict | None]] = {}
_SKELETONS_MAX = 4096
_LITERALS_MAX = 4096    # patterns remembered per skeleton


def _pattern(text: str) -> tuple[str, tuple[str, ...]]:
    """(pattern, the index components as digit strings) of a name's dotted text; the skeleton's
    readers are remembered (`_SKELETONS`)."""
    parts = _INDEX.split("." + text)
    digits = tuple(parts[1::2])
    pattern = ".#".join(parts[::2])[1:]
    if _cacheable(text):
        skeleton = text.encode().translate(_DIGITS_TO_NUL)
        entry = _SKELETONS.get(skeleton)
        if entry is None and len(_SKELETONS) < _SKELETONS_MAX:
            entry = _SKELETONS[skeleton] = _readers(text, parts)
        if entry is not None and entry[2] is not None and len(entry[2]) < _LITERALS_MAX:
            entry[2][entry[1](text)] = pattern
    return pattern, digits


def _readers(text: str, parts: list[str]) -> tuple[Any, Any, dict | None]:
    """(index reader, literal-digit reader or the pattern when there are none, patterns by
    literal digits or None) for the names of ``text``'s skeleton; ``parts`` is its split."""
    slices, pos = [], -1            # offsets in ``text`` (the split ran on "." + text)
    in_index: set[int] = set()
    for k, part in enumerate(parts):
        if k % 2:
            slices.append(slice(pos + 1, pos + 1 + len(part)))
            in_index.update(range(pos + 1, pos + 1 + len(part)))
            pos += 1 + len(part)
        else:
            pos += len(part)
    reader = (itemgetter(*slices) if len(slices) > 1 else
              (lambda s, one=slices[0]: (s[one],)) if slices else (lambda s: ()))
    literal = [i for i, c in enumerate(text) if c in "0123456789" and i not in in_index]
    if not literal:
        return reader, ".#".join(parts[::2])[1:], None
    return reader, itemgetter(*literal), {}


# The compiled `add_tensors` (tensorscope/_groupscan.c), bound to the first record class it is
# given (`_bound`); None when it is not built (or is a stale build). Tests set it to None too.
GROUPSCAN_ABI = 1
_SCAN = optional_extension("_groupscan", GROUPSCAN_ABI)
_bound: list = [None]


def _cacheable(text: str) -> bool:
    return text.isascii() and "\0" not in text


class GroupCollector:
    """Streaming grouping: feed tensors once, read groups in first-seen order.

    A group is (pattern, dtype, shape); it keeps its count, its first member's name and the
    index values seen per ``#`` position (as the digit strings: converted once, at the end),
    never the whole member list (a million tensors stay a few thousand groups).
    """

    __slots__ = ("_groups",)

    def __init__(self):
        self._groups: dict[tuple, list] = {}

    def add(self, name: str, dtype: str, shape: tuple[int, ...], nbytes: int = 0,
            path: tuple[str, ...] = ()) -> None:
        pattern, digits = _pattern(".".join(path) if len(path) > 1 else (path[0] if path else name))
        self._count((pattern, dtype, shape if type(shape) is tuple else tuple(shape)), digits,
                    nbytes, name)

    def _count(self, key: tuple, digits: tuple[str, ...], nbytes: int, name: str) -> None:
        g = self._groups.get(key)
        if g is None:
            # count, bytes, first name, per-position set of the digit strings seen
            self._groups[key] = [1, nbytes, name, [{d} for d in digits]]
            return
        g[0] += 1
        g[1] += nbytes
        for seen, d in zip(g[3], digits):
            seen.add(d)

    def add_tensors(self, tensors) -> None:
        """`add` for each `TensorInfo` (its bytes when it has data). Compiled
        (`tensorscope/_groupscan.c`, the same steps) where it is built; a record it does not read
        is filed by `_add_tensors` in its turn."""
        if _SCAN is not None and type(tensors) is list and tensors:
            if type(tensors[0]) is not _bound[0]:
                try:
                    _SCAN.bind(type(tensors[0]))
                    _bound[0] = type(tensors[0])
                except TypeError:   # not a slots record: every one is Python's
                    pass
            _SCAN.add(self._groups, tensors, self._add_one)
            return
        self._add_tensors(tensors)

    def _add_one(self, t) -> None:
        self._add_tensors((t,))

    def _add_tensors(self, tensors) -> None:
        """`add_tensors` in Python (the compiled loop's twin): `_pattern` and `_count` inlined,
        since this runs once per tensor (10^5-10^6)."""
        groups, skeletons, translate = self._groups, _SKELETONS, bytes.translate
        for t in tensors:
            path = t.path
            text = path[0] if len(path) == 1 else (".".join(path) if path else t.name)
            got = skeletons.get(translate(text.encode(), _DIGITS_TO_NUL)) \
                if text.isascii() and "\0" not in text else None
            if got is None:
                pattern, digits = _pattern(text)
            else:
                indices, pattern, literals = got
                if literals is not None:    # digits outside the indices: part of the pattern
                    pattern = literals.get(pattern(text))
                if pattern is None:
                    pattern, digits = _pattern(text)
                else:
                    digits = indices(text)
            key = (pattern, t.dtype, t.shape)
            g = groups.get(key)
            nbytes = t.nbytes if t.has_data else 0
            if g is None:
                groups[key] = [1, nbytes, t.name, [{d} for d in digits]]
                continue
            g[0] += 1
            g[1] += nbytes
            seen = g[3]
            if len(seen) == 2:   # layers and experts: unrolled (a loop of two costs 4x more)
                seen[0].add(digits[0])
                seen[1].add(digits[1])
            else:
                for values, d in zip(seen, digits):
                    values.add(d)

    def __len__(self) -> int:
        return len(self._groups)

    def groups(self):
        """Yields dicts: pattern, dtype, shape, count, bytes, first, ranges [(lo, hi, distinct)]."""
        for (pattern, dtype, shape), (count, nbytes, first, ranges) in self._groups.items():
            values = [set(map(int, seen)) for seen in ranges]   # "07" and "7" are one index
            yield {"pattern": pattern, "dtype": dtype, "shape": list(shape), "count": count,
                   "bytes": nbytes, "first": first,
                   "ranges": [(min(v), max(v), len(v)) for v in values]}
