"""A skops archive (``skops.io.dump``: ``schema.json`` + ``.npy`` members) judged as skops judges
it: ``skops.io.load`` builds only the types of its default trusted set (copied with provenance into
``policy_data/skops_trusted.json`` by tools/gen_skops_trusted.py) and raises
UntrustedTypesFoundException for any other unless the caller trusts it by name. The schema is read
as JSON (never loaded); each node's ``__module__.__class__`` is judged, code-running ones by the
pickle policy."""
from __future__ import annotations

import json
import os

from .. import policy
from ..errors import FormatError, LimitExceeded

with open(os.path.join(os.path.dirname(policy.__file__), "policy_data", "skops_trusted.json"),
          encoding="utf-8") as _f:
    SKOPS_TRUSTED: frozenset[str] = frozenset(json.load(_f)["trusted"])
# Types each node class trusts by default besides the lists (skops/io/_general.py, _numpy.py,
# _scipy.py): containers, arrays, NumPy random state, scipy sparse matrices.
_NODE_DEFAULTS = frozenset({
    "builtins.dict", "collections.OrderedDict", "collections.defaultdict", "builtins.list",
    "builtins.set", "builtins.tuple", "builtins.slice", "builtins.bytes", "builtins.bytearray",
    "numpy.ndarray", "numpy.ma.core.MaskedArray", "numpy.random.mtrand.RandomState",
    "numpy.random._generator.Generator"})
_ALWAYS_SAFE_NODES = frozenset({"JsonNode"})
_MAX_NODES = 200_000


def untrusted_types(schema) -> tuple[set[str], bool]:
    """(the ``module.class`` names skops would refuse, whether every node was read)."""
    out: set[str] = set()
    stack, seen = [schema], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > _MAX_NODES:
            return out, False
        if isinstance(node, dict):
            mod, cls = node.get("__module__"), node.get("__class__")
            loader = node.get("__loader__")
            if isinstance(mod, str) and isinstance(cls, str) and loader not in _ALWAYS_SAFE_NODES:
                dotted = f"{mod}.{cls}"
                if loader == "SparseMatrixNode" and mod.startswith("scipy.sparse"):
                    pass
                elif dotted not in SKOPS_TRUSTED and dotted not in _NODE_DEFAULTS:
                    out.add(dotted)
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (dict, list)))
    return out, True


def judge(ctx, archive, member) -> bool:
    """Findings for a skops archive; False when ``schema.json`` is not a skops schema."""
    try:
        doc = json.loads(archive.read_bytes(member, 64 << 20).decode("utf-8"))
    except (ValueError, FormatError, LimitExceeded):
        return False
    if not isinstance(doc, dict) or "__loader__" not in doc or "protocol" not in doc:
        return False
    names, complete = untrusted_types(doc)
    for dotted in sorted(names)[:256]:
        mod, _, cls = dotted.rpartition(".")
        v = policy.classify(mod, cls)
        if v.category == policy.DENIED:
            ctx.add("skops.untrusted-type", f"the skops schema builds {dotted}: {v.reason} "
                    "(skops.io.load refuses it unless trusted=[...] names it)", "schema.json",
                    trigger=dotted, variant="denied")
        else:
            ctx.add("skops.untrusted-type", f"the skops schema builds {dotted}, outside skops' "
                    "default trusted types: skops.io.load refuses it unless trusted=[...] names "
                    "it; review its code before trusting it", "schema.json", trigger=dotted)
    if not complete:
        ctx.fail("skops schema with more nodes than the scan reads")
    return True
