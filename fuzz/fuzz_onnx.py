#!/usr/bin/env python3
"""atheris harness: ONNX models (protobuf walker, external data next to the input): open, read every tensor, scan.

Any exception other than TensorscopeError (and any exception at all from scan) is a crash.
Usage (see fuzz/README.md): pip install atheris; python fuzz/fuzz_onnx.py fuzz/corpus/onnx -max_total_time=600
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzzlib  # noqa: E402

if __name__ == "__main__":
    fuzzlib.atheris_main("onnx")
