#!/usr/bin/env python3
"""Write the libFuzzer dictionaries in fuzz/dicts/ (one per atheris target): each format's magic
numbers, the pickle opcodes (from pickletools, the stdlib's own table), the names torch.save
writes, the header keys and dtype names of safetensors / npy / GGUF, protobuf tags of the ONNX
fields the walker reads. `fuzzlib.atheris_main` passes the target's file as ``-dict=``."""
from __future__ import annotations

import pickletools
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dicts"

ZIP = [b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07", b"PK\x07\x08",
       b"\x14\x00", b"\x00\x08", b"\x08\x08", b"\xff\xff\xff\xff", b"\x01\x00\x10\x00",
       b"archive/data.pkl", b"archive/data/0", b"archive/version", b"archive/byteorder",
       b"archive/.data/serialization_id", b"archive/constants.pkl", b"../", b"/"]
PICKLE = sorted({op.code.encode("latin-1") for op in pickletools.opcodes}) + [
    b"\x80\x02", b"\x80\x04", b"\x95", b"ctorch._utils\n_rebuild_tensor_v2\n",
    b"ccollections\nOrderedDict\n", b"ctorch\nFloatStorage\n", b"ctorch\nHalfStorage\n",
    b"ctorch\nBFloat16Storage\n", b"cos\nsystem\n", b"cbuiltins\neval\n", b"storage",
    b"cpu", b"torch", b"_rebuild_tensor_v2", b"(((", b"))))", b"q\x00", b"h\x00", b"r\x00\x00\x00\x00",
    b"\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f", b"J\xff\xff\xff\x7f", b"K\x00", b"M\xff\xff"]
SAFETENSORS = [b'"__metadata__"', b'"dtype"', b'"shape"', b'"data_offsets"', b'"F16"', b'"BF16"',
               b'"F32"', b'"F64"', b'"I8"', b'"U8"', b'"I16"', b'"I32"', b'"I64"', b'"BOOL"',
               b'"F8_E4M3"', b'"F8_E5M2"', b"[0,0]", b"[18446744073709551615]", b"{", b"}"]
NUMPY = [b"\x93NUMPY", b"\x01\x00", b"\x02\x00", b"\x03\x00", b"'descr'", b"'fortran_order'",
         b"'shape'", b"'<f4'", b"'<f2'", b"'|O'", b"'<U8'", b"True", b"False", b"(", b",)",
         b"PK\x03\x04"]
GGUF = [b"GGUF", b"\x03\x00\x00\x00", b"general.architecture", b"general.alignment",
        b"tokenizer.ggml.tokens", b"\x08\x00\x00\x00", b"\x09\x00\x00\x00",
        b"\xff\xff\xff\xff\xff\xff\xff\xff", b"\x00\x00\x00\x00\x00\x00\x00\x00"]
ONNX = [b"\x08\x07", b"\x12\x04onnx", b"\x3a", b"\x42\x02\x10\x0d", b"\x0a", b"\x12", b"\x1a",
        b"\x22", b"\x2a", b"\x32", b"\x3a", b"\x42", b"\x4a", b"\x52", b"\x62", b"\x6a", b"\x72",
        b"\x80\x01", b"external_data", b"location", b"offset", b"length", b"\x08\x01",
        b"\x08\x08", b"\x08\x10", b"\xff\xff\xff\xff\x0f"]
LEGACY = PICKLE + [b"\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19", b"\x8a\x0a", b"protocol_version",
                   b"little_endian", b"type_sizes"]
KERNEL = [b"\x00\x7c", b"\x00\xfc", b"\x01\x7c", b"\x80\x7f", b"\x80\xff", b"\xc0\x7f",
          b"\x00\x00\x80\x7f", b"\x00\x00\xc0\x7f", b"\x01\x00\x00\x00", b"\x00\x80", b"\x7f",
          b"\xff", b"\x80", b"\x00\x00\x00\x00\x00\x00\xf0\x7f"]

DICTS = {"zipfmt": ZIP, "pickle_vm": PICKLE, "torch_zip": ZIP + PICKLE, "listing": ZIP + PICKLE,
         "safetensors": SAFETENSORS, "numpy": NUMPY + ZIP + PICKLE, "gguf": GGUF, "onnx": ONNX,
         "legacy": LEGACY, "diffkernel": KERNEL}


def _escaped(b: bytes) -> str:
    return "".join(chr(c) if 0x20 <= c < 0x7f and c not in (0x22, 0x5c) else f"\\x{c:02x}"
                   for c in b)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for target, words in DICTS.items():
        seen, lines = set(), [f"# {target}: written by fuzz/make_dicts.py"]
        for w in words:
            if w and w not in seen:
                seen.add(w)
                lines.append(f'"{_escaped(w)}"')
        (OUT / f"{target}.dict").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
