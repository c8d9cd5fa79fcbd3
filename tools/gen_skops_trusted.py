"""Copy skops' default trusted types (``skops/io/_trusted_types.py``) into
``tensorscope/policy_data/skops_trusted.json``, with provenance. The scanner judges a skops archive's
types against this list as ``skops.io.load`` does (anything else raises UntrustedTypesFoundException
unless the caller passes it in ``trusted=``); ``tests/test_scan_policy_members.py`` checks that
our reading of a real archive names the same untrusted types as ``skops.io.get_untrusted_types``.

Usage: python tools/gen_skops_trusted.py
"""
import datetime
import json
import os

import skops
from skops.io import _trusted_types as t

OUT = os.path.join(os.path.dirname(__file__), "..", "tensorscope", "policy_data", "skops_trusted.json")
LISTS = ("PRIMITIVE_TYPE_NAMES", "CONTAINER_TYPE_NAMES", "NUMPY_DTYPE_TYPE_NAMES",
         "NUMPY_UFUNC_TYPE_NAMES", "SCIPY_UFUNC_TYPE_NAMES", "SKLEARN_ESTIMATOR_TYPE_NAMES",
         "SKLEARN_INTERNAL_TYPE_NAMES", "NUMPY_RANDOM_BIT_GENERATOR_TYPE_NAMES")
names = sorted({n for lst in LISTS for n in getattr(t, lst, [])})
json.dump({"provenance": {"source": "skops/io/_trusted_types.py", "skops": skops.__version__,
                          "lists": list(LISTS), "date": datetime.date.today().isoformat()},
           "trusted": names}, open(OUT, "w"), indent=0)
print(len(names), "->", OUT)
