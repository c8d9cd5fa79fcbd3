"""What a model repository's configs name for its loaders to import: read, never judged.

transformers' ``auto_map`` (in ``config.json``, ``tokenizer_config.json`` and the processor
configs) and ``custom_pipelines`` (``config.json``: each task's ``impl``), sentence-transformers' ``modules.json`` module types and diffusers' ``model_index.json``
components name Python files of the repository (or of another one) that loading with
``trust_remote_code=True`` imports. `tensorscope.scanning.hf_repo` judges them; ``inspect`` names
them. Files are read as text (local or by URL, at most `MAX_TEXT` bytes) and JSON is parsed with
the standard library.
"""
from __future__ import annotations

import functools
import json
import os
import re

from .remote import is_url, open_source

# Config files whose ``auto_map`` transformers' Auto classes follow, and sentence-transformers'
# module list (read the same way: `auto_map_references`).
AUTO_MAP_CONFIGS = ("config.json", "tokenizer_config.json", "preprocessor_config.json",
                    "processor_config.json", "video_preprocessor_config.json",
                    "feature_extractor_config.json", "image_processor_config.json",
                    "modules.json")
DIFFUSERS_INDEX = "model_index.json"
MAX_TEXT = 4 << 20      # configs and modelling code are KBs to a few hundred KBs
# Libraries a diffusers component may name that are packages, not files of the repository.
_DIFFUSERS_LIBRARIES = {"diffusers", "transformers", "onnxruntime", "onnxruntime.training",
                        "torch", "peft", "sentence_transformers", "optimum", "tokenizers",
                        "flax", "huggingface_hub", "accelerate", "timm", "open_clip", None}
MODULE_NAME = re.compile(r"^[A-Za-z_]\w*$")


def read_text(path: str) -> str | None:
    """The text of a small sibling file, None when absent, unreadable or not UTF-8 text."""
    return _read_remote_text(path) if is_url(path) else _read_text_now(path)


@functools.lru_cache(maxsize=256)
def _read_remote_text(url: str) -> str | None:
    """`read_text` of a URL, remembered: each Python file of a remote repository asks for the
    same few configs (most absent), a request each."""
    return _read_text_now(url)


def _read_text_now(path: str) -> str | None:
    try:
        src = open_source(path)
    except Exception:       # absent or unreachable: the reference is reported as such
        return None
    try:
        data = bytes(src.view(0, min(src.size, MAX_TEXT), "file"))
    except Exception:
        return None
    finally:
        close = getattr(src, "close", None)
        if close is not None:
            close()
    if b"\x00" in data:
        return None
    return data.decode("utf-8", "replace")


def join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}" if is_url(folder) else os.path.join(folder, name)


def split(path: str) -> tuple[str, str]:
    if is_url(path):
        folder, _, name = path.rpartition("/")
        return folder, name
    return os.path.split(path)


def load_json(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def auto_map_references(config) -> list[tuple[str, str, str | None]]:
    """(auto class, module, other repository or None) for each class an ``auto_map`` names, or
    that a sentence-transformers ``modules.json`` (a list) names as a module ``type`` outside
    ``sentence_transformers.*`` (resolved like an auto_map entry since v6, with
    trust_remote_code=True)."""
    refs: list[tuple[str, str, str | None]] = []
    if isinstance(config, list):
        types = {f"module {m.get('name')}": m["type"] for m in config[:4096]
                 if isinstance(m, dict) and isinstance(m.get("type"), str)
                 and not m["type"].startswith("sentence_transformers.")}
        config = {"auto_map": types}
    if not isinstance(config, dict):
        return refs
    auto_map = config.get("auto_map")
    auto_map = dict(auto_map) if isinstance(auto_map, dict) else {}
    # transformers' pipeline(): a custom task's "impl" is "module.Class" (or
    # "repo--module.Class") that get_class_from_dynamic_module imports, like an auto_map entry
    pipelines = config.get("custom_pipelines")
    if isinstance(pipelines, dict):
        for task, spec in list(pipelines.items())[:4096]:
            if isinstance(spec, dict) and isinstance(spec.get("impl"), str):
                auto_map[f"custom_pipelines {task}"] = spec["impl"]
    for auto_class, value in auto_map.items():
        for ref in value if isinstance(value, list) else [value]:
            if not isinstance(ref, str) or not ref:
                continue
            repo = None
            if "--" in ref:
                repo, _, ref = ref.partition("--")
            module = ref.rpartition(".")[0] if "." in ref else ref
            refs.append((str(auto_class), module, repo))
    return refs


def diffusers_references(index: dict) -> list[tuple[str, str]]:
    """(what, module file relative to the repository) of each custom component or pipeline a
    diffusers ``model_index.json`` names."""
    refs: list[tuple[str, str]] = []
    if not isinstance(index, dict):
        return refs
    cls = index.get("_class_name")
    if isinstance(cls, list) and len(cls) == 2 and isinstance(cls[0], str) and \
            cls[0] not in _DIFFUSERS_LIBRARIES and MODULE_NAME.match(cls[0]):
        refs.append((f"pipeline {cls[1]}", f"{cls[0]}.py"))
    for component, value in index.items():
        if component.startswith("_") or not isinstance(value, list) or len(value) != 2:
            continue
        library = value[0]
        if isinstance(library, str) and library not in _DIFFUSERS_LIBRARIES and \
                MODULE_NAME.match(library) and MODULE_NAME.match(component):
            refs.append((f"component {component}", f"{component}/{library}.py"))
    return refs


def references_in(folder: str, config_name: str) -> list[tuple[str, str, str | None]]:
    """`auto_map_references` of one of the folder's `AUTO_MAP_CONFIGS` (only modules.json is a
    list)."""
    text = read_text(join(folder, config_name))
    doc = load_json(text) if text is not None else None
    if isinstance(doc, list) and config_name != "modules.json":
        return []
    return auto_map_references(doc)


def named_code(folder: str) -> list[str]:
    """The code files a repository folder's configs name for its loaders to import
    (``auto_map`` modules, ``other/repo--module`` references, diffusers components)."""
    names: list[str] = []
    for config_name in AUTO_MAP_CONFIGS:
        for _, module, repo in references_in(folder, config_name):
            names.append(f"{repo}--{module}.py" if repo else f"{module}.py")
    text = read_text(join(folder, DIFFUSERS_INDEX))
    names += [file for _, file in diffusers_references(load_json(text) if text else None)]
    return list(dict.fromkeys(names))
