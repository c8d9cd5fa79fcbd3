#!/usr/bin/env python3
"""atheris harness: the symbolic pickle VM alone (parsers/pickle_vm.run), in memory.

Any exception other than TensorscopeError (and any exception at all from scan) is a crash.
Usage (see fuzz/README.md): pip install atheris; python fuzz/fuzz_pickle_vm.py fuzz/corpus/pickle_vm -max_total_time=600
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzzlib  # noqa: E402

if __name__ == "__main__":
    fuzzlib.atheris_main("pickle_vm")
