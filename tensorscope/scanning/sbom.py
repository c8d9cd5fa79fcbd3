"""``scan --sbom FILE``: a CycloneDX 1.6 ML-BOM (JSON) of what was scanned.

Two halves. `scan_with_inventory` is per-file work (pure and picklable, so it runs on the
``--jobs`` processes and the Dask workers beside the scan): it opens the file once, scans that
`ModelFile` (`scan_model`: no second parse) and describes it — sha256 of its bytes, size, format,
tensor and parameter counts, dtypes, the producer and framework records of its metadata, the
other files it is made of (shards, ONNX external data). `write_sbom` then builds the BOM with
``cyclonedx-python-lib`` in the calling process: one ``machine-learning-model`` component per
model file (a file only holding another model's tensors is a ``data`` component), license and
base model from the folder's model card (``README.md`` YAML front matter) or the file's own
metadata (GGUF ``general.*``), the framework from a ``config.json`` beside it, dependencies for
the relations (an index on its shards, an ONNX model on its external data), and every finding as
a vulnerability whose id is the rule id (suppressed ones with the reason, as ``will_not_fix``).
The document is validated against the 1.6 schema by the library's own JSON validator before it
is written.

The hash reads every byte once, in 1 MiB blocks (`baseline.file_sha256`: flat memory, at the
speed of a plain read-and-hash of the file); the scan, which reads the same file's headers and
pickles through its map, finds those pages in the page cache. A remote file (URL) is not downloaded for a hash: its component carries the
object's ETag/version instead.

Model cards and configs are hostile text: the front matter is composed by PyYAML's SafeLoader
into a node tree and only plain top-level scalars and lists of scalars are read from it (nothing
is constructed); ``config.json`` is read with json, both with a size bound.
"""
from __future__ import annotations

import json
import os
from typing import Any

from ..remote import is_url
from .baseline import file_sha256
from .report import FileReport

__all__ = ["scan_with_inventory", "inventory_of", "write_sbom", "model_card"]

_CARD_BYTES = 1 << 20          # model cards and configs read at most this much
_META_VALUE_CHARS = 200
# metadata records that name what produced a file, per format (ModelFile.metadata keys)
_META_KEYS = ("producer_name", "producer_version", "ir_version", "opset_import", "domain",
              "model_version", "version", "format_version", "pickle_protocol", "archive_format",
              "byteorder")


def scan_with_inventory(path: str, *, explicit: bool = True, limits=None,
                        known_data: bool = False) -> tuple[FileReport, dict[str, Any] | None]:
    """Scan one file and describe it for the SBOM: ``(FileReport, inventory)``; the inventory
    is None for a file the scan skipped (not a model). The file is parsed once: the scan judges
    the `ModelFile` opened here."""
    from ..formats import open_model
    from .loader import scan_file, scan_model
    model = None
    try:
        model = open_model(path)   # a URL: its headers by range, as the scan reads them
    except Exception:  # noqa: BLE001 — the scan below reports why (never clean)
        model = None
    try:
        if model is not None:
            report = scan_model(model, path=path, explicit=explicit, limits=limits,
                                known_data=known_data)
        else:
            report = scan_file(path, limits=limits, explicit=explicit, known_data=known_data)
        if not report.scanned:
            return report, None
        return report, inventory_of(path, model, report)
    finally:
        if model is not None:
            model.close()


def inventory_of(path: str, model=None, report: FileReport | None = None) -> dict[str, Any]:
    """The JSON-ready description of one scanned file (``model``: the `ModelFile` opened from
    it, None when it could not be opened)."""
    inv: dict[str, Any] = {"sha256": None, "size": None, "format": None, "tensors": None,
                           "parameters": None, "dtypes": [], "parts": [], "data_files": [],
                           "metadata": {}, "parsed": model is not None}
    if is_url(path):
        from .. import remote
        from .identity import identity
        ident = remote.seen(path) or identity(path)   # what the scan read: no new request
        inv["size"], inv["version"] = ident["size"], ident["version"]
    else:
        try:
            inv["size"] = os.path.getsize(path)
            inv["sha256"] = file_sha256(path)
        except OSError:
            pass
    if model is None:
        return inv
    inv["format"] = model.format
    import math
    tensors = model.tensors
    # once per tensor, at C speed: 10^6 tensors cost well under a second
    params = sum(map(math.prod, (t.shape for t in tensors)))
    dtypes = {str(d) for d in {t.dtype for t in tensors}}
    files = {t.file for t in tensors if t.file}
    inv["tensors"], inv["parameters"], inv["dtypes"] = len(model.tensors), params, sorted(dtypes)
    here = _real(path)
    others = [f for f in (model.files or ()) if _real(f) != here]
    data = sorted({_real(f) for f in files if _real(f) != here})
    if model.format == "sharded":
        inv["parts"] = others
    else:
        inv["data_files"] = data
    inv["metadata"] = _metadata_records(model.metadata)
    return inv


def _real(path: str) -> str:
    return path if is_url(path) else os.path.realpath(path)


def _metadata_records(meta: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}

    def put(key, value):
        if isinstance(value, (str, int, float, bool)) and len(out) < 64:
            out[str(key)[:100]] = str(value)[:_META_VALUE_CHARS]

    for k in _META_KEYS:
        if k in meta:
            v = meta[k]
            put(k, json.dumps(v, sort_keys=True) if isinstance(v, dict) else v)
    st = meta.get("__metadata__")
    if isinstance(st, dict):
        for k, v in st.items():
            put(f"safetensors.{k}", v)
    gguf = meta.get("gguf")
    kv = gguf.get("kv") if isinstance(gguf, dict) else None
    if isinstance(kv, dict):
        for k, v in kv.items():
            if str(k).startswith("general.") and not isinstance(v, (list, dict)):
                put(k, v)
    return out


# ---------------------------------------------------------------------------------------------
# Model cards and configs

_YAML_STR, _YAML_SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:seq"


def model_card(folder: str) -> dict[str, Any]:
    """``license``, ``license_name``, ``base_model`` (list), ``library_name``, ``pipeline_tag``,
    ``datasets`` from ``folder/README.md``'s YAML front matter; {} when there is none or it does
    not parse. Only plain scalars are read off the composed node tree: no tag is constructed."""
    text = _read_text(os.path.join(folder, "README.md"))
    if not text or not text.startswith("---"):
        return {}
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() in ("---", "..."))
    except StopIteration:
        return {}
    try:
        import yaml
    except ImportError:  # tensorscope[sbom] brings it
        return {}
    try:
        root = yaml.compose("\n".join(lines[1:end]), Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    if not isinstance(root, yaml.MappingNode) or root.tag != "tag:yaml.org,2002:map":
        return {}
    out: dict[str, Any] = {}
    for knode, vnode in root.value:
        if not isinstance(knode, yaml.ScalarNode):
            continue
        key = knode.value
        if key not in ("license", "license_name", "license_link", "base_model", "library_name",
                       "pipeline_tag", "datasets"):
            continue
        # plain data only: a node with an explicit tag (!!python/..., !custom) is not read
        if isinstance(vnode, yaml.ScalarNode) and vnode.tag == _YAML_STR:
            vals = [vnode.value]
        elif isinstance(vnode, yaml.SequenceNode) and vnode.tag == _YAML_SEQ:
            vals = [n.value for n in vnode.value[:32]
                    if isinstance(n, yaml.ScalarNode) and n.tag == _YAML_STR]
        else:
            continue
        vals = [str(v)[:_META_VALUE_CHARS] for v in vals if str(v).strip()]
        if vals:
            out[key] = vals if key in ("base_model", "datasets") else vals[0]
    return out


def hf_config(folder: str) -> dict[str, str]:
    """``transformers_version``, ``model_type``, ``architectures``, ``torch_dtype`` of the
    ``config.json`` in ``folder``; {} without one."""
    text = _read_text(os.path.join(folder, "config.json"))
    if not text:
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    out = {}
    for k in ("transformers_version", "model_type", "torch_dtype", "dtype"):
        if isinstance(doc.get(k), (str, int, float)):
            out[k] = str(doc[k])[:_META_VALUE_CHARS]
    arch = doc.get("architectures")
    if isinstance(arch, list):
        out["architectures"] = ",".join(str(a) for a in arch[:8])[:_META_VALUE_CHARS]
    return out


def _read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read(_CARD_BYTES)
    except OSError:
        return None
    return data.decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------
# The BOM

def write_sbom(out_path: str, report, inventories: dict[str, dict[str, Any]]) -> None:
    """Write the ML-BOM of ``report`` (a `ScanReport` or `JudgedReport`) to ``out_path``;
    ``inventories`` maps each scanned file to `inventory_of`'s dict. Raises `TensorscopeError`
    when the library is missing or the document does not validate."""
    from ..errors import TensorscopeError
    try:
        from cyclonedx.model import HashAlgorithm, HashType, Property
        from cyclonedx.model.bom import Bom
        from cyclonedx.model.component import Component, ComponentType, Pedigree
        from cyclonedx.model.vulnerability import (BomTarget, ImpactAnalysisResponse,
                                                   Vulnerability, VulnerabilityAnalysis,
                                                   VulnerabilityRating, VulnerabilitySeverity,
                                                   VulnerabilitySource)
        from cyclonedx.output.json import JsonV1Dot6
        from cyclonedx.schema import SchemaVersion
        from cyclonedx.validation.json import JsonStrictValidator
    except ImportError:
        raise TensorscopeError("--sbom needs cyclonedx-python-lib: pip install "
                               "'tensorscope[sbom]'") from None
    from .. import __version__

    bom = Bom()
    tool = Component(type=ComponentType.APPLICATION, name="tensorscope", version=__version__,
                     bom_ref="tool:tensorscope")
    bom.metadata.tools.components.add(tool)
    data_files = {_real(d) for inv in inventories.values() for d in inv["data_files"]}
    folders: dict[str, tuple[dict, dict]] = {}
    comps: dict[str, Component] = {}
    real_to_path: dict[str, str] = {}
    for path in report.files:
        inv = inventories.get(path)
        if inv is None:
            continue
        local = not is_url(path)
        real = _real(path)
        real_to_path[real] = path
        is_data = real in data_files
        props = [("tensorscope:format", inv["format"] or "unknown"),
                 ("tensorscope:size", inv["size"]), ("tensorscope:parsed", inv["parsed"])]
        if not is_data:
            props += [("tensorscope:tensors", inv["tensors"]),
                      ("tensorscope:parameters", inv["parameters"])]
            props += [("tensorscope:dtype", d) for d in inv["dtypes"]]
        if inv.get("version"):
            props.append(("tensorscope:version", inv["version"]))
        props += [(f"tensorscope:metadata:{k}", v) for k, v in sorted(inv["metadata"].items())]
        meta = inv["metadata"]
        licenses, bases = [], []
        card: dict[str, Any] = {}
        if local:
            folder = os.path.dirname(os.path.abspath(path))
            if folder not in folders:
                folders[folder] = (model_card(folder), hf_config(folder))
            card, cfg = folders[folder]
            props += [(f"tensorscope:config:{k}", v) for k, v in sorted(cfg.items())]
            if cfg.get("transformers_version"):
                props.append(("tensorscope:framework", f"transformers {cfg['transformers_version']}"))
            for k in ("library_name", "pipeline_tag"):
                if card.get(k):
                    props.append((f"tensorscope:model-card:{k}", card[k]))
            props += [("tensorscope:model-card:dataset", d) for d in card.get("datasets", ())]
        lic = card.get("license") or meta.get("general.license")
        if lic and not is_data:
            licenses.append(_license(str(lic), card.get("license_name")))
        bases = list(card.get("base_model", ())) or \
            [v for k, v in sorted(meta.items()) if k.startswith("general.base_model.")
             and k.endswith((".name", ".repo_url"))][:1]
        if meta.get("producer_name"):
            props.append(("tensorscope:producer", " ".join(
                filter(None, (meta.get("producer_name"), meta.get("producer_version"))))))
        comp = Component(
            type=ComponentType.DATA if is_data else ComponentType.MACHINE_LEARNING_MODEL,
            name=path.replace(os.sep, "/"), bom_ref=f"file:{path}",
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=inv["sha256"])]
            if inv["sha256"] else None,
            licenses=licenses or None,
            pedigree=Pedigree(ancestors=[
                Component(type=ComponentType.MACHINE_LEARNING_MODEL, name=b,
                          bom_ref=f"base:{path}:{i}") for i, b in enumerate(bases)])
            if bases and not is_data else None,
            properties=[Property(name=k, value=str(v)) for k, v in props if v is not None])
        bom.components.add(comp)
        comps[path] = comp
    # relations: an index on its shards, an ONNX model on its external data
    for path, comp in comps.items():
        inv = inventories[path]
        deps = []
        for other in [*inv["parts"], *inv["data_files"]]:
            p = real_to_path.get(_real(other))
            if p is not None and p in comps and p != path:
                deps.append(comps[p])
        if deps:
            bom.register_dependency(comp, deps)
    levels = {"critical": VulnerabilitySeverity.CRITICAL, "high": VulnerabilitySeverity.HIGH,
              "medium": VulnerabilitySeverity.MEDIUM, "low": VulnerabilitySeverity.LOW,
              "info": VulnerabilitySeverity.INFO}
    source = VulnerabilitySource(name="tensorscope")
    every = [(f, None) for f in report.findings] + list(getattr(report, "suppressed", ()))
    for i, (f, supp) in enumerate(every):
        props = [("tensorscope:file", f.file), ("tensorscope:member", f.member),
                 ("tensorscope:offset", f.offset), ("tensorscope:offset-base", f.offset_base),
                 ("tensorscope:trigger", f.trigger)]
        analysis = None
        if supp is not None:
            props.append(("tensorscope:suppressed-by", supp.source))
            analysis = VulnerabilityAnalysis(responses=[ImpactAnalysisResponse.WILL_NOT_FIX],
                                             detail=supp.reason)
        comp = comps.get(f.file)
        bom.vulnerabilities.add(Vulnerability(
            bom_ref=f"finding:{i}", id=f.rule, source=source, description=f.message,
            ratings=[VulnerabilityRating(source=source, severity=levels[str(f.severity)])],
            affects=[BomTarget(ref=comp.bom_ref.value)] if comp is not None else None,
            analysis=analysis,
            properties=[Property(name=k, value=str(v)) for k, v in props if v is not None]))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the library warns of a BOM without a root component
        text = JsonV1Dot6(bom).output_as_string(indent=1)
    err = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if err is not None:
        raise TensorscopeError(f"{out_path}: the SBOM does not validate against CycloneDX 1.6: "
                               f"{err}")
    tmp = f"{out_path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.write("\n")
    os.replace(tmp, out_path)


def _license(text: str, name):
    """A model card's ``license`` as CycloneDX takes it: an SPDX id (case as SPDX spells it), an
    expression, or a named license (HF's ``other`` with ``license_name``)."""
    try:
        from cyclonedx.contrib.license.factories import LicenseFactory
    except ImportError:  # cyclonedx-python-lib < 11
        from cyclonedx.factory.license import LicenseFactory
    from cyclonedx.model.license import DisjunctiveLicense
    text = text.strip()
    if text.lower() in ("other", "unknown") and name:
        return DisjunctiveLicense(name=str(name))
    return LicenseFactory().make_from_string(text)
