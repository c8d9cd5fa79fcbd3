#!/usr/bin/env python3
"""atheris harness: _diffkernel.stats/equal on two pieces cut from the input (byte 0: the dtype codes, byte 1: their offsets, any alignment; byte 2: AVX-512 or portable, tolerances), held to an aligned copy and to numpy.

Any exception other than TensorscopeError, or a difference from the Python twin, is a crash; under
the sanitizer build (.ci/sanitize.sh), so is any ASan/UBSan report.
Usage (see fuzz/README.md): python fuzz/fuzz_diffkernel.py fuzz/corpus/diffkernel -max_total_time=600
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzzlib  # noqa: E402

if __name__ == "__main__":
    fuzzlib.atheris_main("diffkernel")
