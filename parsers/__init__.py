"""Format parsers: one module per container or format, plus the pickle VM and the zip reader.

Installed as ``tensorscope.parsers``. Parsers read bytes through `tensorscope.source.ByteSource`,
never print, never decide severity, and never import torch, onnx's full model loader, or any
module named in a file.
"""
