"""Sharded checkpoints and model folders: one model across several files.

Spec (Hugging Face conventions, as ``transformers`` writes and reads them; FORMATS.md "HF index"):
- An index file ``<name>.index.json`` (``model.safetensors.index.json``,
  ``pytorch_model.bin.index.json``) is a JSON object ``{"metadata": {"total_size": n, ...},
  "weight_map": {tensor name: shard file name}}``. Shard names are relative to the index's folder
  (``model-0000i-of-0000n.safetensors``); each shard is a complete model file of its own format.
- Every tensor of the map MUST be in its shard. A tensor in a shard but not in the map is loaded by
  transformers anyway (recorded as ``sharded.unmapped_tensor``); a name held by two shards keeps
  the map's choice (``sharded.duplicate_tensor``). ``total_size`` SHOULD be the sum of the tensors'
  bytes (``sharded.total_size_mismatch`` otherwise), tied tensors counted once: transformers
  4.x ``.bin`` shards keep both names of a tied weight (GPT-2 ``lm_head.weight`` and
  ``transformer.wte.weight``) over one storage, and count that storage once.
- A shard name MUST stay inside the model folder: absolute names, ``..`` components and symlinks
  resolving outside are refused (CWE-22). In a Hugging Face cache (``models--org--name/`` holding
  ``blobs/``, ``refs/`` and ``snapshots/<rev>/``) snapshot files are symlinks into ``../../blobs/``:
  the boundary is then the ``models--*`` folder.
- A folder is a model when it holds: one index file (with several, the safetensors index wins, as
  in transformers); else one group of shards ``<stem>-0000i-of-0000n.<ext>`` without an index
  (every number from 1 to n MUST be present); else exactly one model file (safetensors first, then
  ``.bin``/``.pt``/``.pth``/``.ckpt``, ``.gguf``, ``.onnx``, ``.pt2``, ``.npz``/``.npy``; among
  several of one kind, the one named ``model``/``pytorch_model``/``consolidated``.*). A
  ``models--*`` cache folder opens the snapshot ``refs/main`` names, else the newest one.
  A folder of one model file opens as that file (its own format; ``metadata["model_file"]``).

What this parser produces: a ModelFile of format ``sharded`` whose tensors are the shards'
tensors, in index order (each keeping its own ``file``), with the shards' sources, custom readers
and evidence merged so `read` works across files. ``metadata`` has the index metadata, the shard
list (file, format, tensors, bytes) and each shard's own metadata.

Public: ``FORMAT``, ``sniff_dir(path)``, ``open_dir(path)``, ``open_index(path)``.
"""
from __future__ import annotations

import contextvars
import itertools
import json
import operator
import os
import re
from contextlib import contextmanager
from typing import Any, Callable

from tensorscope import remote
from tensorscope.errors import FormatError
from tensorscope.model import ModelFile
from tensorscope.remote import is_url

from . import safetensors

__all__ = ["FORMAT", "sniff_dir", "open_dir", "open_index", "is_index_file", "single_file",
           "each_shard"]

FORMAT = "sharded"
INDEX_MAX = 256 << 20  # 1e6 tensors: ~90 MB (json.dumps defaults), ~110 MB with indent=2
_SHARD = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.(?P<ext>safetensors|bin|pt|pth|gguf)$")
# Single model files, best first (transformers prefers safetensors over .bin).
_MODEL_EXTS = (".safetensors", (".bin", ".pt", ".pth", ".ckpt"), ".gguf", ".onnx", ".pt2",
               (".npz", ".npy"))
_MODEL_STEMS = {"model", "pytorch_model", "tf_model", "flax_model", "consolidated"}


def _fail(reason: str, file: str, offset: int | None = None) -> FormatError:
    return FormatError(reason, format=FORMAT, file=file, offset=offset)


def is_index_file(path: str) -> bool:
    return os.path.basename(path).endswith(".index.json")


# -- where the model is ---------------------------------------------------------------------------
def _hf_repo_of(folder: str) -> str | None:
    """The ``models--*`` cache folder that ``folder`` is (or is a snapshot of), if any."""
    real = os.path.realpath(folder)
    for cand in (real, os.path.dirname(os.path.dirname(real))):
        if os.path.basename(cand).startswith("models--") and os.path.isdir(os.path.join(cand, "snapshots")):
            return cand
    return None


def _snapshot(repo: str) -> str | None:
    snaps = os.path.join(repo, "snapshots")
    try:
        with open(os.path.join(repo, "refs", "main"), encoding="utf-8") as f:
            rev = f.read(256).strip()
        if rev and "/" not in rev and rev not in (".", "..") and os.path.isdir(os.path.join(snaps, rev)):
            return os.path.join(snaps, rev)
    except (OSError, UnicodeDecodeError):
        pass
    try:
        revs = [os.path.join(snaps, r) for r in os.listdir(snaps)]
    except OSError:
        return None
    revs = [r for r in revs if os.path.isdir(r)]
    return max(revs, key=lambda r: os.lstat(r).st_mtime) if revs else None


def _files(folder: str) -> list[str]:
    if is_url(folder):
        return remote.list_files(folder)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [n for n in names if os.path.isfile(os.path.join(folder, n))]


def _plan(folder: str) -> tuple[str, Any, list[str]] | None:
    """(kind, what, ignored alternatives): ("index", path) | ("shards", [paths]) | ("single", path)."""
    names = _files(folder)
    indexes = [n for n in names if n.endswith(".index.json")]
    if indexes:
        indexes.sort(key=lambda n: (n != "model.safetensors.index.json",
                                    ".safetensors." not in n, n))
        return "index", os.path.join(folder, indexes[0]), indexes[1:]
    groups: dict[tuple[str, str, str], list[str]] = {}
    for n in names:
        m = _SHARD.match(n)
        if m:
            groups.setdefault((m["stem"], m["n"], m["ext"]), []).append(n)
    if groups:
        keys = sorted(groups, key=lambda k: (k[2] != "safetensors", k))
        ignored = [n for k in keys[1:] for n in groups[k]]
        return "shards", (keys[0], sorted(groups[keys[0]])), ignored
    for exts in _MODEL_EXTS:
        found = [n for n in names if n.endswith(exts)]
        if len(found) > 1:   # pytorch_model.bin beside training_args.bin: the model's own name wins
            found = [n for n in found if n.split(".", 1)[0] in _MODEL_STEMS] or found
        if len(found) == 1:
            rest = [n for n in names if n != found[0] and n.endswith(_all_exts())]
            return "single", os.path.join(folder, found[0]), rest
        if found:
            return None   # several candidates of the same kind: not one model
    return None


def _all_exts() -> tuple[str, ...]:
    out: list[str] = []
    for e in _MODEL_EXTS:
        out.extend(e if isinstance(e, tuple) else (e,))
    return tuple(out)


def _resolve(path: str) -> tuple[str, str, str | None]:
    """(folder holding the model, containment root, HF revision or None)."""
    repo = None if is_url(path) else _hf_repo_of(path)
    if repo is not None and os.path.realpath(path) == repo:
        snap = _snapshot(repo)
        if snap is None:
            raise _fail("Hugging Face cache folder has no snapshot", path)
        return snap, repo, os.path.basename(snap)
    return path, repo or path, os.path.basename(os.path.realpath(path)) if repo else None


def sniff_dir(path: str) -> bool:
    try:
        folder, _, _ = _resolve(path)
    except FormatError:
        return False
    return _plan(folder) is not None


# -- opening ----------------------------------------------------------------------------------------
def _inside(root: str, name: str, *, origin: str, what: str) -> str:
    """The path of ``name`` inside ``root``'s model folder, refusing escapes (CWE-22)."""
    if not name or "\0" in name or os.path.isabs(name) or name.startswith(("/", "\\")) \
            or any(part == ".." for part in re.split(r"[/\\]", name)):
        raise _fail(f"{what} {name!r} is not a plain relative path inside the model folder "
                    "(path traversal refused)", origin)
    return name


def _check_real(root: str, path: str, origin: str, name: str) -> None:
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise _fail(f"shard {name!r} resolves to {real}, outside the model folder {real_root} "
                    "(symlink escape refused)", origin)


def _open_shard(folder: str, root: str, name: str, origin: str, why: str) -> ModelFile:
    from tensorscope.formats import open_model  # the registry imports this module lazily
    _inside(root, name, origin=origin, what="shard name")
    path = os.path.join(folder, name)
    if is_url(path):
        return open_model(path)  # no symlinks behind a URL; a missing shard fails on open
    if not os.path.lexists(path) or not os.path.exists(path):
        raise _fail(f"shard {name} {why} does not exist", path)
    _check_real(root, path, origin, name)
    if os.path.isdir(path):
        raise _fail(f"shard {name} is a folder, not a model file", path)
    return open_model(path)


def _index_bytes(path: str) -> bytes:
    try:
        if is_url(path):
            with remote.RemoteSource(path) as src:
                size, raw = src.size, src.read(0, min(src.size, INDEX_MAX + 1))
        else:
            size = os.path.getsize(path)
        if size > INDEX_MAX:
            raise _fail(f"index file of {size} bytes exceeds the {INDEX_MAX}-byte limit", path)
        if not is_url(path):
            with open(path, "rb") as f:
                raw = f.read(size + 1)  # not INDEX_MAX + 1: read() allocates what it asks for
    except OSError as e:
        raise _fail(f"cannot read the index: {e.strerror}", path) from None
    return raw


def _index_columns(path: str) -> tuple[dict, list[str], dict, list[str]]:
    """(names: name -> the same string, in the map's order; each one's shard name, one string
    per shard; metadata; duplicate names) of an index file. Read in C where it is built and the
    index is in its subset (`tensorscope/_stheader.c`'s ``index_map``: no escape in the map, no
    key twice); else by `_parse_index`."""
    raw = _index_bytes(path)
    got = _compiled_index(raw)
    if got is not None:
        names, shards, doc = got
        meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        return names, shards, meta, []
    wm, meta, dups = _parse_index(raw, path)
    canon: dict[str, str] = {}
    shards = list(map(canon.setdefault, wm.values(), wm.values()))
    return dict(zip(wm, wm)), shards, meta, dups


def _compiled_index(raw: bytes) -> tuple[dict, list[str], dict] | None:
    """(names, shards, the other members parsed) from ``index_map``, or None (not built, not
    UTF-8, outside its subset, or a member json.loads refuses or that repeats a key inside:
    `_parse_index` then reads the whole text and says what is wrong)."""
    index_map = getattr(safetensors._HEADER, "index_map", None)
    if index_map is None or json.detect_encoding(raw) != "utf-8":
        return None
    got = index_map(raw)
    if got is None:
        return None
    names, shards, others = got
    doc: dict[str, Any] = {}
    for key, start, end, strings in others:
        try:
            value = json.loads(raw[start:end].decode("utf-8", "surrogatepass"))
        except (ValueError, RecursionError):
            return None
        if _strings(value) != strings:   # a key twice inside (json keeps the last)
            return None
        doc[key] = value
    return names, shards, doc


def _parse_index(raw: bytes, path: str) -> tuple[dict, dict, list[str]]:
    """(weight_map, metadata, duplicate names) of an index file's bytes."""
    encoding = json.detect_encoding(raw)
    strings = _string_count(raw) if encoding == "utf-8" else -1   # UTF-16/32: not counted
    try:   # decoded as json.loads decodes bytes, and the bytes dropped (a 1M index: 90 MB)
        text = raw.decode(encoding, "surrogatepass")
    except ValueError as e:
        raise _fail(f"invalid index JSON: {e}", path) from None
    del raw
    doc = _loads_index(text, path, None)
    dups: list[str] = []
    if strings != _strings(doc):   # a key appeared twice: read again to name it
        def pairs(items):
            d = {}
            for k, v in items:
                if k in d:
                    dups.append(k)
                d[k] = v
            return d
        doc = _loads_index(text, path, pairs)
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise _fail('index has no "weight_map" object', path)
    wm = doc["weight_map"]
    if set(map(type, wm.values())) - {str}:
        k, v = next((k, v) for k, v in wm.items() if not isinstance(v, str))
        raise _fail(f"weight_map[{k!r}] is {type(v).__name__}, not a shard file name", path)
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    return wm, meta, dups


def _loads_index(text: str, path: str, pairs) -> Any:
    try:
        return json.loads(text, object_pairs_hook=pairs)
    except RecursionError:
        raise _fail("index JSON nests too deeply", path) from None
    except ValueError as e:
        pos = getattr(e, "pos", None)
        raise _fail(f"invalid index JSON: {e}", path, pos if isinstance(pos, int) else None) from None


# Duplicate keys, without a Python hook per object (a 1M-tensor index is one object of 10^6
# pairs): json keeps the last value of a repeated key, so the parsed document then holds fewer
# strings (keys and string values) than the text. Counted in C: without a backslash every quote
# delimits a string; with one, a regex skips the escaped quotes.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _string_count(raw: bytes) -> int:
    return raw.count(b'"') // 2 if b"\\" not in raw else len(_STRING.findall(raw))


def _strings(v: Any) -> int:
    """Strings (keys and values) in a parsed JSON value; a weight_map's are counted in C."""
    if isinstance(v, dict):
        vals = v.values()
        if set(map(type, vals)) <= {str}:
            return 2 * len(v)
        return len(v) + sum(map(_strings, vals))
    if isinstance(v, list):
        return sum(map(_strings, v))
    return isinstance(v, str)


# A listener told of each shard as soon as it is parsed (`each_shard`), for a consumer that shows
# a model while the rest of it is still being read (the TUI's first screen).
_ON_SHARD: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("on_shard", default=None)


@contextmanager
def each_shard(listener: Callable[[str, ModelFile, int, int], None]):
    """Within it, every shard that `open_dir`/`open_index` parses is handed at once to
    ``listener(name, shard, k, total)`` (the k-th of ``total`` shards, 1-based, in the order they
    are read: the index's order, else their numbers; with an index, its first numbered shard
    ``<stem>-00001-of-N`` is read and told first, before the index, ``total`` then being that N),
    before the next shard is read; the open then returns the whole model as it would without the
    listener. The shard is the parsed file (its own tensors, in its own order); the model's order
    and checks come at the end."""
    token = _ON_SHARD.set(listener)
    try:
        yield
    finally:
        _ON_SHARD.reset(token)


class _Merger:
    def __init__(self, path: str, origin: str, total: int = 0):
        self.model = ModelFile(FORMAT, path, files=[])
        self.origin = origin
        self.shards: list[dict] = []
        self.opened: dict[str, ModelFile] = {}
        self.total = total
        self.listener = _ON_SHARD.get()
        self.told = 0   # shards the listener was told of

    def add(self, name: str, sub: ModelFile, tell: bool = True) -> None:
        self.opened[name] = sub
        m = self.model
        if not is_url(sub.path):
            m.parts[sub.path] = sub
        m.files.extend(f for f in sub.files if f not in m.files)
        m.sources.update(sub.sources)
        m.custom_readers.update(sub.custom_readers)
        m.evidence.extend(sub.evidence)
        m.extras.setdefault("shards", {})[name] = sub.extras
        self.shards.append({"file": name, "format": sub.format, "tensors": len(sub.tensors),
                            "bytes": sub.total_bytes, "metadata": sub.metadata})
        if self.listener is not None and tell:
            self.told += 1
            self.listener(name, sub, self.told, self.total)

    def close(self) -> None:
        for sub in self.opened.values():
            sub.close()


def _early_shard(index: str, folder: str, root: str, listener) -> tuple[str, ModelFile] | None:
    """For a listener (`each_shard`): the index's first numbered shard (``model-00001-of-000NN``
    beside ``model.safetensors.index.json``), parsed and told before the index is read (a 10^6-
    tensor index is ~90 MB of JSON). None when there is none, or it does not parse (the index then
    decides, as without a listener). The index still decides the model: a shard it does not name
    is closed unused."""
    if is_url(folder):
        return None
    base = os.path.basename(index)[:-len(".index.json")]   # model.safetensors
    stem, _, ext = base.rpartition(".")
    for name in _files(folder):
        m = _SHARD.match(name)
        if m and m["stem"] == stem and m["ext"] == ext and int(m["i"]) == 1:
            try:
                sub = _open_shard(folder, root, name, index, "(the first numbered shard)")
            except (FormatError, OSError):
                return None
            listener(name, sub, 1, int(m["n"]))
            return name, sub
    return None


def _from_index(index: str, folder: str, root: str) -> ModelFile:
    listener = _ON_SHARD.get()
    early = _early_shard(index, folder, root, listener) if listener is not None else None
    # The map as two columns: the names (name -> the same string, in the map's order; the
    # shards' records take these strings instead of their own copies) and each one's shard
    # (one string per shard name: json makes one per value). The map itself, and its 10^5-
    # 10^6 value strings, are dropped before the shards are read.
    try:
        names, shards, imeta, dups = _index_columns(index)
    except BaseException:
        if early is not None:
            early[1].close()
        raise
    merger = _Merger(index, index)
    model = merger.model
    model.files.append(index)
    if early is not None:
        merger.told = 1
    try:
        order = list(dict.fromkeys(shards))                     # in first-mapped order
        merger.total = len(order)
        first = dict(zip(reversed(shards), reversed(names)))    # shard -> first tensor mapped
        with safetensors.sharing_names(names):
            for shard in order:
                if early is not None and shard == early[0]:   # read and told before the index
                    merger.add(shard, early[1], tell=False)
                    continue
                merger.add(shard, _open_shard(folder, root, shard, index,
                                              f"(named by the index for {first[shard]!r})"))
        if early is not None and early[0] not in merger.opened:
            early[1].close()   # a numbered file the index does not name: not part of the model
        del first
        for name in dups:
            model.evidence.add("sharded.duplicate_key", f"weight_map names {name!r} twice; the "
                               "last entry wins", file=index)
        subs = [merger.opened[shard] for shard in order]
        tensors = _mapped(names, shards, order, subs)
        exact = tensors is not None
        if not exact:
            tensors = _mapped_slowly(dict(zip(names, shards)), order, merger.opened,
                                     model.evidence, index)
        model.tensors = tensors
        total = imeta.get("total_size")
        if exact and all(sub.format == "safetensors" for sub in subs):
            mapped_bytes = sum(map(_nbytes, tensors))   # safetensors tiles: no shared bytes
        else:   # one storage under two names (tied weights) counts once, as in transformers
            spans = {(t.file, t.byte_offset, t.nbytes) if t.byte_offset is not None else id(t):
                     t.nbytes for t in tensors[:len(names)]}
            mapped_bytes = sum(spans.values())
        if isinstance(total, int) and not isinstance(total, bool) and total != mapped_bytes:
            model.evidence.add("sharded.total_size_mismatch", f"index total_size is {total}, the "
                               f"mapped tensors take {mapped_bytes} bytes", file=index)
        model.metadata = {"index": os.path.basename(index), "index_metadata": imeta,
                          "shards": merger.shards}
        return model
    except BaseException:
        merger.close()
        if early is not None and early[0] not in merger.opened:
            early[1].close()
        raise


_name = operator.attrgetter("name")
_file = operator.attrgetter("file")
_nbytes = operator.attrgetter("nbytes")


def _mapped(names: dict, shards: list[str], order: list[str], subs: list[ModelFile]) -> list | None:
    """The records in index order (``names``, with ``shards`` the shard of each) when every
    mapped tensor is in its shard and the shards hold nothing else, each name once (checked in
    C over whole columns); else None.

    ``names`` (name -> the same string) is the table: each name's value becomes its record, in
    place (no second table of 10^5-10^6 entries, no lookup per name to read them back in index
    order). Its keys stay the map's: a key a shard added is removed before None is returned."""
    count = len(names)
    shard_of: dict[str, str] = {}   # record file -> shard
    held = 0
    same_files = True
    for shard, sub in zip(order, subs):
        names.update(zip(map(_name, sub.tensors), sub.tensors))
        held += len(sub.tensors)
        for f in set(map(_file, sub.tensors)):
            if shard_of.setdefault(f, shard) != shard:
                same_files = False
        if not same_files or len(names) != count:
            break
    if len(names) != count:   # a tensor the map does not name
        for key in list(itertools.islice(names, count, None)):
            del names[key]
        return None
    if not same_files or held != count:
        return None
    tensors = list(names.values())
    if str in set(map(type, tensors)):   # a mapped name no shard holds (or one held twice)
        return None
    if list(map(shard_of.__getitem__, map(_file, tensors))) != shards:
        return None
    return tensors


def _mapped_slowly(wm: dict, order: list[str], opened: dict[str, ModelFile], evidence,
                   index: str) -> list:
    """`_mapped` one tensor at a time: the error or the anomalies (tensors in no shard, in a
    shard the map does not name, or in two shards)."""
    tensors = []
    by_name = {shard: opened[shard]._by_name() for shard in order}
    for tname, shard in wm.items():
        t = by_name[shard].get(tname)
        if t is None:
            raise _fail(f"tensor {tname!r} is mapped to shard {shard}, which does not hold it",
                        index)
        tensors.append(t)
    for shard in order:
        for t in opened[shard].tensors:
            if t.name not in wm:
                evidence.add("sharded.unmapped_tensor", f"shard {shard} holds {t.name!r}, "
                             "which the index does not map (transformers loads it anyway)",
                             file=index)
                tensors.append(t)
            elif wm[t.name] != shard:
                evidence.add("sharded.duplicate_tensor", f"{t.name!r} is in shard {shard} "
                             f"too; the index maps it to {wm[t.name]}", file=index)
    return tensors


def _from_shards(folder: str, root: str, key: tuple[str, str, str], names: list[str]) -> ModelFile:
    stem, n, ext = key
    count = int(n)
    merger = _Merger(folder, folder, count)
    model = merger.model
    try:
        present = set(names)
        for i in range(1, count + 1):
            name = f"{stem}-{i:05d}-of-{n}.{ext}"
            if name not in present:
                raise _fail(f"shard {name} is missing (the shards are numbered 1..{count}, no index)",
                            os.path.join(folder, name))
            merger.add(name, _open_shard(folder, root, name, folder, "(numbered shard)"))
        seen: dict[str, str] = {}
        for name in merger.opened:
            for t in merger.opened[name].tensors:
                if t.name in seen:
                    model.evidence.add("sharded.duplicate_tensor", f"{t.name!r} is in {seen[t.name]} "
                                       f"and {name}; the first is listed", file=os.path.join(folder, name))
                    continue
                seen[t.name] = name
                model.tensors.append(t)
        extra = sorted(present - set(merger.opened))
        if extra:
            model.evidence.add("sharded.extra_shard", f"shards beyond 1..{count}: {', '.join(extra)}",
                               file=folder)
        model.metadata = {"index": None, "shards": merger.shards}
        return model
    except BaseException:
        merger.close()
        raise


def _single(path: str, root: str) -> ModelFile:
    """A folder holding one model file is that file: its own format and metadata (plus the
    file's name), not a one-shard "sharded" model."""
    folder = os.path.dirname(path)
    name = os.path.basename(path)
    model = _open_shard(folder, root, name, folder, "(the folder's model file)")
    model.metadata["model_file"] = name
    return model


def single_file(path: str) -> str | None:
    """The model file of a folder that holds exactly one (what `open_dir` opens), else None."""
    try:
        folder, _, _ = _resolve(path)
    except FormatError:
        return None
    plan = _plan(folder)
    return plan[1] if plan is not None and plan[0] == "single" else None


def open_index(path: str) -> ModelFile:
    """Open the model an index file describes (shards relative to its folder)."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    repo = None if is_url(folder) else _hf_repo_of(folder)
    return _from_index(path, folder, repo or folder)


def open_dir(path: str) -> ModelFile:
    """Open a model folder: index, numbered shards, one model file, or a Hugging Face cache."""
    path = os.fspath(path)
    folder, root, revision = _resolve(path)
    plan = _plan(folder)
    if plan is None:
        raise _fail("folder holds no index file, numbered shards or single model file", folder)
    kind, what, ignored = plan
    if kind == "index":
        model = _from_index(what, folder, root)
    elif kind == "shards":
        model = _from_shards(folder, root, what[0], what[1])
    else:
        model = _single(what, root)
    model.path = path
    if revision:
        model.metadata["hf_revision"] = revision
    if ignored:
        model.metadata["ignored_files"] = ignored
    return model
