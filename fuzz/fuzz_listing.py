#!/usr/bin/env python3
"""atheris harness: a torch zip opened for listing from memory (tensorscope.open(..., listing=True): _zipscan.scan/records/exact/distinct, _torchstep.tensor/infos), its records held to the Python steps.

Any exception other than TensorscopeError, or a difference from the Python twin, is a crash; under
the sanitizer build (.ci/sanitize.sh), so is any ASan/UBSan report.
Usage (see fuzz/README.md): python fuzz/fuzz_listing.py fuzz/corpus/listing -max_total_time=600
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzzlib  # noqa: E402

if __name__ == "__main__":
    fuzzlib.atheris_main("listing")
