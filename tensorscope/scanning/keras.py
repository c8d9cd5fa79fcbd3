"""Keras model configs: the JSON that `keras.saving.load_model` turns into objects, read as data.

A Keras v3 archive (``.keras``: a zip of ``config.json``, ``metadata.json`` and
``model.weights.h5``) and a legacy HDF5 model (``.h5``: the JSON of the root group's
``model_config`` attribute) describe a model as nested objects ``{"module", "class_name",
"config", "registered_name"}`` that the loader imports and builds. Three ways to run code:

- A ``Lambda`` layer whose function is marshalled bytecode: Keras 3 ``{"class_name":
  "__lambda__", "config": {"code": <base64>}}``, Keras 2 ``"function": [<base64>, ...]`` with
  ``"function_type": "lambda"``. The loader unmarshals and calls it (CVE-2024-3660); Keras 3
  refuses it in ``safe_mode`` for ``.keras`` files, never for ``.h5`` ones (CVE-2025-9905).
- A module outside Keras named by any object: Keras up to 3.8 imported it, and called a
  function reference, even in ``safe_mode`` (CVE-2025-1550).
- A Keras or TensorFlow function that is a gadget by itself, referenced from a Lambda layer
  and called with the config's arguments: ``get_file`` downloads and writes anywhere
  (CVE-2025-8747), ``enable_unsafe_deserialization`` and a nested ``load_model(...,
  safe_mode=False)`` switch the guard off (CVE-2025-9906), ``tf.io.write_file`` writes files.

Nothing here unmarshals, imports or builds anything: the JSON is parsed with `json` and walked.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
import tokenize
from typing import Any, Iterator

from .. import policy

# Packages of the Keras family: a config naming them is what Keras itself writes.
HOME_ROOTS = frozenset({"keras", "tf_keras", "tensorflow", "keras_hub", "keras_nlp", "keras_cv",
                        "keras_rs"})

# Functions of those packages that are gadgets when a config makes Keras call them (matched on
# the dotted name, ``keras.src.`` read as ``keras.``; a prefix ending in "." covers a module).
GADGETS: dict[str, str] = {
    "keras.utils.get_file": "downloads a URL and writes it anywhere (CVE-2025-8747)",
    "keras.utils.file_utils.get_file": "downloads a URL and writes it anywhere (CVE-2025-8747)",
    "keras.config.enable_unsafe_deserialization":
        "turns safe_mode off for the rest of the load (CVE-2025-9906)",
    "keras.saving.serialization_lib.enable_unsafe_deserialization":
        "turns safe_mode off for the rest of the load (CVE-2025-9906)",
    "keras.models.load_model": "loads a second model, with safe_mode as the config says",
    "keras.saving.load_model": "loads a second model, with safe_mode as the config says",
    "keras.saving.saving_api.load_model": "loads a second model, with safe_mode as the config says",
    "keras.models.model_from_json": "builds a second model from JSON",
    "keras.utils.python_utils.func_load": "unmarshals and runs bytecode",
    "keras.utils.io_utils.": "reads and writes files",
    "keras.utils.file_utils.": "reads, writes and downloads files",
    "keras.saving.": "loads models and weights from files",
    "keras.backend.tensorflow.": "runs TensorFlow file and py_function ops",
    "tensorflow.io.": "reads and writes files (tf.io.write_file, tf.io.gfile)",
    "tensorflow.raw_ops.": "raw ops read and write files and run programs",
    "tensorflow.py_function": "calls a Python function",
    "tensorflow.numpy_function": "calls a Python function",
    "tensorflow.compat.": "TensorFlow 1 file, py_func and session ops",
    "tensorflow.load_op_library": "loads a native library",
    "tensorflow.load_library": "loads a native library",
    "tensorflow.saved_model.": "loads a second model",
    "tensorflow.keras.utils.get_file": "downloads a URL and writes it anywhere (CVE-2025-8747)",
    "tensorflow.keras.models.load_model": "loads a second model",
    "tf_keras.utils.get_file": "downloads a URL and writes it anywhere",
    "tf_keras.models.load_model": "loads a second model",
}

MAX_CONFIG_BYTES = 64 << 20    # a real config is KBs to a few MB; the walk is bounded by this
MAX_NODES = 2_000_000
# marshal's short ASCII strings (names, attribute and module names): type 'z' or 'Z' (interned),
# with or without the reference flag 0x80, a one-byte length, the characters.
_SHORT_ASCII = re.compile(rb"[\x5a\x7a\xda\xfa]([\x01-\x40])")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def gadget(dotted: str) -> str | None:
    """Why calling ``dotted`` (a Keras-family function) runs or writes something, or None."""
    key = dotted.replace("keras.src.", "keras.", 1) if dotted.startswith("keras.src.") else dotted
    key = key.replace("tensorflow.python.", "tensorflow.", 1)
    for prefix, why in GADGETS.items():
        if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
            return why
    return None


def looks_like_config(doc: Any) -> bool:
    """A Keras model config: an object with ``class_name`` and ``config`` at the top."""
    return isinstance(doc, dict) and isinstance(doc.get("class_name"), str) and "config" in doc


def findings(doc: Any) -> Iterator[tuple[str, str, str, str]]:
    """(rule, variant or "", message, trigger) for every object of a config that runs code or
    imports outside Keras; ``doc`` is the parsed JSON. Iterative, bounded by `MAX_NODES`."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    seen = 0
    while stack and seen < MAX_NODES:
        node, where = stack.pop()
        seen += 1
        if isinstance(node, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(node))))
            continue
        if not isinstance(node, dict):
            continue
        cls, module, config = node.get("class_name"), node.get("module"), node.get("config")
        if cls == "Lambda" and isinstance(config, dict):
            yield from _lambda(config, where or "config")
        if cls == "__lambda__" and isinstance(config, dict) and "code" in config:
            yield _bytecode(config.get("code"), where)
        elif isinstance(module, str) and isinstance(cls, str):
            target = f"{module}.{config}" if cls == "function" and isinstance(config, str) \
                else f"{module}.{cls}"
            hit = _reference(module, target, calls=cls == "function", where=where)
            if hit is not None:
                yield hit
        stack.extend((v, f"{where}.{k}" if where else str(k))
                     for k, v in reversed(list(node.items())) if isinstance(v, (dict, list)))


def _lambda(config: dict, where: str) -> Iterator[tuple[str, str, str, str]]:
    """Keras 2's Lambda (``function`` a list, ``function_type`` lambda or raw)."""
    fn, kind = config.get("function"), config.get("function_type")
    code = fn[0] if isinstance(fn, list) and fn else fn
    if isinstance(code, str) and kind == "lambda":
        if _is_base64(code):
            yield _bytecode(code, f"{where}.function")
        else:
            yield _source(code, f"{where}.function")
    elif isinstance(fn, str) and kind in ("raw", "function"):
        module = config.get("module")
        module = module if isinstance(module, str) and module else "__main__"
        hit = _reference(module, f"{module}.{fn}", calls=True, where=f"{where}.function")
        if hit is not None:
            yield hit


def _bytecode(code: Any, where: str) -> tuple[str, str, str, str]:
    """The finding for marshalled bytecode: the names it holds (read from the bytes, never
    unmarshalled) as evidence."""
    names: list[str] = []
    if isinstance(code, str):
        try:
            raw = base64.b64decode(code[:1 << 20], validate=False)
        except (binascii.Error, ValueError):
            raw = b""
        names = _marshal_names(raw)
    shown = f" (names in it: {', '.join(names)})" if names else ""
    return ("keras.lambda-bytecode", "",
            f"Lambda layer at {where} holds marshalled Python bytecode{shown}: the loader "
            "unmarshals and calls it (CVE-2024-3660; .h5 files ignore safe_mode, CVE-2025-9905)",
            ", ".join(names[:3]) or "bytecode")


def _is_base64(code: str) -> bool:
    """Keras' func_dump output: base64 of marshalled code (func_load decodes it the same way)."""
    try:
        # codecs' base64 (what func_dump writes) breaks lines every 76 characters
        return bool(base64.b64decode(re.sub(r"\s+", "", code[:1 << 20]), validate=True))
    except (binascii.Error, ValueError):
        return False


def _source(code: str, where: str) -> tuple[str, str, str, str]:
    """A Lambda whose function is Python source text (``lambda x: eval(...)``), judged with the
    repository-code rules: tokenized, never compiled. Keras' func_load would base64-decode and
    unmarshal it (and fail), so the verdict is what the text is written to do."""
    from . import torchscript
    text = code[:1 << 20]
    try:
        hits = torchscript.source_dangers(text)
    except (tokenize.TokenError, *torchscript.SOURCE_UNREADABLE):
        hits = []
    if hits:
        return ("keras.lambda-source", "dangerous",
                f"Lambda layer at {where} holds Python source that "
                + "; ".join(what for _, what in hits[:3])
                + " (Keras unmarshals Lambda bytecode and fails on source text; a loader or "
                "tool that compiles it runs it)", hits[0][0])
    return ("keras.lambda-source", "", f"Lambda layer at {where} holds Python source text "
            "instead of marshalled bytecode: nothing dangerous in it, and Keras' func_load fails "
            "on it", "source")


def _marshal_names(raw: bytes, most: int = 12) -> list[str]:
    """Identifiers among the short strings of marshalled code (``os``, ``system``), in order,
    read from the bytes: the code object is never unmarshalled."""
    names: dict[str, None] = {}
    for m in _SHORT_ASCII.finditer(raw):
        n = m.group(1)[0]
        text = raw[m.end():m.end() + n].decode("latin-1")
        if len(text) == n and _IDENTIFIER.match(text):
            names[text] = None
            if len(names) >= most:
                break
    return list(names)


def _reference(module: str, target: str, calls: bool, where: str
               ) -> tuple[str, str, str, str] | None:
    root = module.split(".", 1)[0]
    what = "calls" if calls else "imports and builds"
    if module == "builtins":
        # Keras' own spelling for its built-in functions ("relu" is looked up in
        # keras.activations, keras.losses ...); only a denied Python builtin is a finding.
        verdict = policy.classify(module, target[len(module) + 1:])
        if verdict.category != policy.DENIED:
            return None
        return ("keras.dangerous-function", "",
                f"config at {where or 'the top'} names {target}, which the loader {what}: "
                f"{verdict.reason}", target)
    if root in HOME_ROOTS:
        why = gadget(target)
        if why is None:
            return None
        return ("keras.dangerous-function", "",
                f"config at {where or 'the top'} makes the loader call {target}: it {why}",
                target)
    name = target[len(module) + 1:]
    verdict = policy.classify(module, name)
    if verdict.category == policy.DENIED:
        return ("keras.dangerous-function", "",
                f"config at {where or 'the top'} names {target}, which the loader {what}: "
                f"{verdict.reason}", target)
    if verdict.category in (policy.ALLOWED, policy.FRAMEWORK) and not calls:
        return None
    return ("keras.foreign-module", "function" if calls else "class",
            f"config at {where or 'the top'} names {target} outside Keras: Keras up to 3.8 "
            f"imports {module} and {what} it even with safe_mode (CVE-2025-1550); later "
            "versions only when it is registered", target)


def parse(text: bytes | str) -> Any:
    """The JSON document, or None when it is not JSON (or larger than `MAX_CONFIG_BYTES`)."""
    if len(text) > MAX_CONFIG_BYTES:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


# -- HDF5: the configs are attribute values, found as JSON text in the file ----------------------
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_STARTS = (b'{"class_name"', b'{"module"')
MAX_CANDIDATES = 4096               # JSON starts tried per file
MAX_DECODED = 256 << 20             # bytes of text decoded per file


def is_hdf5(head: bytes) -> bool:
    """HDF5's signature at 0 (or after a user block of 512 * 2^k bytes, within ``head``)."""
    at = 0
    while at + 8 <= len(head):
        if head[at:at + 8] == HDF5_MAGIC:
            return True
        at = 512 if at == 0 else at * 2
    return False


def hdf5_configs(raw, size: int) -> tuple[list[tuple[int, Any]], bool]:
    """([(offset, parsed config)], complete) for every Keras config stored as JSON text in an
    HDF5 file: the ``model_config`` and ``training_config`` attributes Keras 2 writes.
    Attribute values lie contiguously in the file (object header messages, heap blocks), so
    the JSON is found by its first bytes and decoded up to the NUL that ends or pads it;
    nothing of HDF5's structure is trusted. ``complete`` is False when the candidate or byte
    budget ran out first."""
    starts: list[int] = []
    for pattern in _STARTS:
        at = raw.find(pattern, 0, size)
        while at >= 0 and len(starts) < MAX_CANDIDATES:
            starts.append(at)
            at = raw.find(pattern, at + 1, size)
    complete = len(starts) < MAX_CANDIDATES
    decoder = json.JSONDecoder()
    out: list[tuple[int, Any]] = []
    covered = decoded = 0
    for at in sorted(starts):
        if at < covered:
            continue    # inside a document already read
        nul = raw.find(b"\0", at, min(size, at + MAX_CONFIG_BYTES))
        end = nul if nul >= 0 else min(size, at + MAX_CONFIG_BYTES)
        if decoded + end - at > MAX_DECODED:
            return out, False
        decoded += end - at
        text = bytes(raw[at:end]).decode("utf-8", "replace")
        try:
            doc, used = decoder.raw_decode(text)
        except (ValueError, RecursionError):
            continue
        covered = at + len(text[:used].encode("utf-8", "replace"))
        if looks_like_config(doc):
            out.append((at, doc))
    return out, complete
