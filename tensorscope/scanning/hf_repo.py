"""Hugging Face model repositories: the code and the templates their loaders run.

A repository's weights can be perfectly inert while loading it still runs code the repository
ships:

- ``auto_map`` in ``config.json``, ``tokenizer_config.json``, ``preprocessor_config.json`` ...
  names ``module.Class`` (or ``other/repo--module.Class``); ``from_pretrained(...,
  trust_remote_code=True)`` fetches ``module.py`` and, recursively, the files it imports
  relatively (``from .x import``), and imports them: their top level runs.
- ``custom_generate/generate.py`` runs under ``generate(custom_generate=repo,
  trust_remote_code=True)``.
- diffusers' ``model_index.json`` names a component as ``[library, class]``; a library that is
  no installed package is ``<component>/<library>.py`` of the repository (custom components and
  pipelines, loaded with ``trust_remote_code=True``).
- sentence-transformers' ``modules.json`` names each module's ``type``; one outside
  ``sentence_transformers.*`` is resolved like an ``auto_map`` entry (v6, with
  ``trust_remote_code=True``).
- Chat templates (``tokenizer_config.json`` ``chat_template``, ``chat_template.jinja``,
  ``chat_template.json``, ``additional_chat_templates/*.jinja``) are Jinja rendered for every
  chat; transformers renders them sandboxed, so a template that reaches dunders or names
  interpreter gadgets is an attempt to escape that sandbox (and other renderers).
- An MLflow model's ``MLmodel`` names a ``python_function`` ``loader_module``;
  ``mlflow.pyfunc.load_model`` puts the model's ``code/`` folder on ``sys.path`` and imports it.

Everything is read as text: JSON is parsed with the standard library, Python sources are tokenized
(`torchscript.source_dangers`), templates are parsed by jinja2 and their trees judged
(`chat_template`). Nothing is imported or rendered.
"""
from __future__ import annotations

import os
import posixpath
import re
from typing import TYPE_CHECKING

from ..remote import is_url
from ..repo_code import (AUTO_MAP_CONFIGS, DIFFUSERS_INDEX, MODULE_NAME, auto_map_references,
                         diffusers_references, join, load_json, read_text, references_in,
                         split)
from . import chat_template, torchscript, yaml_tree

if TYPE_CHECKING:
    from .context import ScanContext

SUFFIXES = (".py", ".jinja")   # beside the JSON configs of `configs.CONFIG_SUFFIXES`
MAX_SOURCE = 1 << 20    # characters of one Python source judged (the rest is reported unread)
# transformers' `get_relative_imports`: ``import .x`` and ``from .x import ...``.
# (blanks as [ \t]: a leading \s* under re.M would rescan every following empty line: O(n^2))
_RELATIVE_IMPORT = re.compile(
    r"^[ \t]*(?:import[ \t]+\.(\S+)[ \t]*$|from[ \t]+\.(\S+)[ \t]+import)", re.M)
_FROM_DOT_IMPORT = re.compile(r"^[ \t]*from[ \t]+\.[ \t]+import[ \t]+([\w ,()]+)", re.M)


def _relative_imports(text: str) -> list[str]:
    found = []
    for m in _RELATIVE_IMPORT.finditer(text):
        name = (m.group(1) or m.group(2) or "").split(".")[0]
        if MODULE_NAME.match(name):
            found.append(name)
    for m in _FROM_DOT_IMPORT.finditer(text):
        found.extend(n for n in re.split(r"[\s,()]+", m.group(1)) if MODULE_NAME.match(n))
    return found


def _closure(folder: str, modules: list[str], limit: int = 64) -> dict[str, str | None]:
    """module -> its text (None when absent) for ``modules`` and what they import relatively."""
    texts: dict[str, str | None] = {}
    todo = list(dict.fromkeys(modules))
    while todo and len(texts) < limit:
        module = todo.pop(0)
        if module in texts:
            continue
        # only a plain module name is a file beside the config (never a path out of the folder)
        text = read_text(join(folder, f"{module}.py")) if MODULE_NAME.match(module) else None
        texts[module] = text
        if text is not None:
            todo.extend(m for m in _relative_imports(text) if m not in texts)
    return texts


def remote_code_loaders(py_path: str) -> list[str]:
    """What makes a loader import this Python file of a repository ("config.json auto_map
    AutoModel", "custom_generate", ...); empty when nothing in the repository names it."""
    folder, name = split(py_path)
    if not name.endswith(".py"):
        return []
    module = name[:-3]
    parent, sub = split(folder)
    if sub == "custom_generate" and name == "generate.py":
        return ["generate(custom_generate=..., trust_remote_code=True)"]
    why: list[str] = []
    for config_name in AUTO_MAP_CONFIGS:
        refs = references_in(folder, config_name)
        local = [m for _, m, repo in refs if repo is None]
        if not local:
            continue
        if module in local:
            names = sorted({c for c, m, r in refs if m == module and r is None})
            plain = config_name == "modules.json" or all(c.startswith("custom_pipelines ")
                                                         for c in names)
            why.append(f"{config_name} {'' if plain else 'auto_map '}" + ", ".join(names))
        elif module in _closure(folder, local):
            why.append(f"a relative import of the code {config_name}'s auto_map names")
    for index_folder, rel in ((folder, name), (parent, f"{sub}/{name}")):
        text = read_text(join(index_folder, DIFFUSERS_INDEX))
        index = load_json(text) if text is not None else None
        for what, file in diffusers_references(index):
            if file == rel:
                why.append(f"{DIFFUSERS_INDEX} {what}")
    return why


MLMODEL = "MLmodel"


def mlmodel_loader(text: str) -> tuple[str | None, str | None]:
    """(loader_module, code folder) of an MLmodel's python_function flavor (None when absent),
    read from the YAML as mlflow's yaml.safe_load decodes it (any style: block, flow, anchors,
    quoted escapes), composed by PyYAML and never constructed."""
    try:
        docs = yaml_tree.compose(text)
    except yaml_tree.YAMLUnreadable:
        return None, None
    doc = docs[0].value if docs else None
    flavors = doc.get("flavors") if isinstance(doc, dict) else None
    pyfunc = flavors.get("python_function") if isinstance(flavors, dict) else None
    if not isinstance(pyfunc, dict):
        return None, None
    loader = pyfunc.get("loader_module")
    code = pyfunc.get("code")
    loader = loader.strip() if isinstance(loader, str) and loader.strip() else None
    code = code if isinstance(code, str) and code not in ("", "null", "~") else None
    return loader, code


def _mlflow_custom(loader: str | None) -> bool:
    """A loader module of the model's own (MLflow's flavors are ``mlflow.*``)."""
    return bool(loader) and not loader.startswith("mlflow.") and \
        all(MODULE_NAME.match(p) for p in loader.split("."))


def mlflow_loaders(py_path: str) -> list[str]:
    """Why mlflow.pyfunc.load_model imports this file: the ``MLmodel`` beside the ``code/``
    folder holding it (MLflow's layout: ``code_paths`` are copied there) names it as its
    loader_module. Nothing above that model folder is read."""
    if is_url(py_path) or not py_path.endswith(".py"):
        return []
    here = os.path.abspath(py_path)
    folder = os.path.dirname(here)
    for _ in range(4):      # code/my_loader.py, code/pkg/loader.py, code/pkg/sub/__init__.py
        if os.path.basename(folder) == "code":
            model = os.path.dirname(folder)
            text = read_text(os.path.join(model, MLMODEL))
            loader, code = mlmodel_loader(text) if text is not None else (None, None)
            if _mlflow_custom(loader) and code:
                base = os.path.join(model, code, *loader.split("."))
                if here in (base + ".py", os.path.join(base, "__init__.py")):
                    return [f"{MLMODEL} python_function loader_module {loader}"]
            return []
        folder = os.path.dirname(folder)
    return []


def check_mlmodel(ctx: "ScanContext", path: str, text: str) -> None:
    """An MLflow model whose python_function flavor loads through a module of its own."""
    if len(text) > yaml_tree.MAX_YAML:
        ctx.add("mlflow.loader-module", f"an MLmodel larger than {yaml_tree.MAX_YAML >> 20} MiB: "
                "its loader_module is not read (real ones are a few hundred bytes)", None, None,
                "size", variant="unread")
        return
    loader, code = mlmodel_loader(text)
    if not _mlflow_custom(loader):
        return
    where = ""
    if code and not is_url(path):
        base = os.path.join(os.path.dirname(path), code, *loader.split("."))
        present = os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py"))
        where = (f" from its {code}/ folder (judged on its own)" if present else
                 f" (not in its {code}/ folder: whatever module of that name is installed)")
    ctx.add("mlflow.loader-module", f"python_function loader_module {loader}: "
            f"mlflow.pyfunc.load_model imports it and calls its _load_pyfunc{where}", None, None,
            loader)


def check_python(ctx: "ScanContext", path: str, text: str, explicit: bool) -> bool:
    """Judge a repository's Python file; False when no loader imports it and it was not named
    (a helper script beside the weights runs only when someone runs it)."""
    import tokenize
    why = remote_code_loaders(path)
    rule = "hf.remote-code"
    if why:
        ctx.add(rule, f"Python source imported when the model is loaded with "
                f"trust_remote_code=True ({'; '.join(why)}): its top level runs", None)
    else:
        why = mlflow_loaders(path)
        if why:
            rule = "mlflow.loader-module"
            ctx.add(rule, f"Python source imported when the model is loaded with "
                    f"mlflow.pyfunc.load_model ({why[0]}): its top level runs", None)
    if not why and not explicit:
        return False
    # real modelling files are under 250 KB (tokenizing costs ~1.3 s per MB)
    text = torchscript.budgeted(ctx, text, MAX_SOURCE, rule, None, "unread")
    try:
        hits = torchscript.source_dangers(text)
    except (tokenize.TokenError, *torchscript.SOURCE_UNREADABLE) as e:
        ctx.add(rule, f"Python source does not tokenize ({e}): not read", None,
                variant="unread")
        return True
    for trigger, what in hits:
        ctx.add(rule, f"Python source {what}: "
                + ("code that the loader imports and runs" if why else
                   "nothing in the repository names this file, whoever imports it runs it"),
                None, None, trigger, variant="dangerous")
    if not why and not hits:
        ctx.add("file.not-a-model", "Python source that no model config names; it runs only "
                "when someone runs or imports it")
    return True


def check_config(ctx: "ScanContext", path: str, text: str) -> None:
    """``auto_map`` references, diffusers custom components and chat templates of one JSON
    config of a repository."""
    folder, name = split(path)
    doc = load_json(text)
    if isinstance(doc, list) and name == "modules.json":
        refs, what = auto_map_references(doc), "modules.json's module types name"
    elif isinstance(doc, dict):
        refs = auto_map_references(doc)
        what = "auto_map names" if not isinstance(doc.get("custom_pipelines"), dict) else \
            "auto_map and custom_pipelines name" if isinstance(doc.get("auto_map"), dict) else \
            "custom_pipelines names"
        _check_peft_auto_mapping(ctx, doc)
    else:
        return
    local = sorted({m for _, m, repo in refs if repo is None})
    if local:
        texts = _closure(folder, local)
        present = [m for m in local if texts.get(m) is not None]
        absent = [m for m in local if texts.get(m) is None]
        ctx.add("hf.remote-code",
                f"{what} code that loading with trust_remote_code=True imports: "
                + ", ".join(f"{m}.py" for m in local)
                + (f" (not in this folder: {', '.join(f'{m}.py' for m in absent)})" if absent
                   else "") + ("; each file is judged on its own" if present else ""),
                None, None, local[0])
    for repo in sorted({r for _, _, r in refs if r is not None}):
        modules = sorted({m for _, m, r in refs if r == repo})
        ctx.add("hf.remote-code",
                f"{what} code in another repository, {repo} "
                f"({', '.join(f'{m}.py' for m in modules)}): trust_remote_code=True fetches and "
                "imports it, and this scan did not read it", None, None, repo,
                variant="other-repo")
    if not isinstance(doc, dict):
        return
    if name == DIFFUSERS_INDEX:
        refs_d = diffusers_references(doc)
        if refs_d:
            ctx.add("hf.remote-code",
                    "model_index.json names custom code that diffusers imports with "
                    "trust_remote_code=True: " + ", ".join(f"{what} ({file})"
                                                           for what, file in refs_d),
                    None, None, refs_d[0][1])
    templates = doc.get("chat_template")
    if isinstance(templates, str):
        check_template(ctx, templates, "chat_template")
    elif isinstance(templates, list):
        for item in templates[:64]:
            if isinstance(item, dict) and isinstance(item.get("template"), str):
                check_template(ctx, item["template"], f"chat_template {item.get('name')!s}")


# peft's AutoPeftModel.from_pretrained imports adapter_config.json's auto_mapping parent_library
# (importlib.import_module) when no task_type is set; peft 0.21 refuses libraries outside
# this allowlist (peft/auto.py get_default_import_allowlist), older versions import any.
PEFT_IMPORT_ALLOWLIST = ("diffusers", "lerobot", "megatron-core", "transformers")


def _check_peft_auto_mapping(ctx: "ScanContext", doc: dict) -> None:
    mapping = doc.get("auto_mapping")
    if not isinstance(mapping, dict) or doc.get("task_type") is not None:
        return
    parent = mapping.get("parent_library")
    if not isinstance(parent, str) or any(parent == a or parent.startswith(a + ".")
                                          for a in PEFT_IMPORT_ALLOWLIST):
        return
    ctx.add("peft.auto-mapping-import", f"adapter config auto_mapping parent_library "
            f"{parent!r}: AutoPeftModel.from_pretrained imports it by name (peft 0.21 refuses "
            "a library outside its import allowlist unless import_allowlist names it; older "
            "peft imported any)", None, None, parent[:80])


def check_template(ctx: "ScanContext", text: str, where: str) -> None:
    chat_template.report(ctx, "hf.chat-template-code", text, where,
                         "rendering it for chat tries to escape to the interpreter")


def check_file(ctx: "ScanContext", path: str, text: str, explicit: bool) -> bool:
    """Judge one text file of a repository; True when it is one this module reads (so its
    findings, medium ones included, are the file's report)."""
    base = posixpath.basename(path.replace("\\", "/"))
    lower = base.lower()
    if base == MLMODEL:
        before = len(ctx.findings)
        check_mlmodel(ctx, path, text)
        return len(ctx.findings) > before
    if lower.endswith(".py"):
        return check_python(ctx, path, text, explicit)
    if lower.endswith(".jinja"):
        check_template(ctx, text, os.path.basename(path))
        return True
    if lower.endswith(".json") and ("config" in lower or lower in (DIFFUSERS_INDEX, "modules.json",
                                                                    "chat_template.json")):
        before = len(ctx.findings)
        check_config(ctx, path, text)
        return len(ctx.findings) > before
    return False
