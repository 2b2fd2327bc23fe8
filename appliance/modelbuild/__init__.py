"""Build, quantize and evaluate the reference models (``models/<name>/``).

Runtime-safe modules (numpy + onnxruntime only): :mod:`.data`, :mod:`.evaluate`, :mod:`.quantize`,
:mod:`.manifest_writer`, :mod:`.cli`. Build-only modules import torch lazily: :mod:`.train`, :mod:`.export`,
:mod:`.net` (imports torch at import time; only the two former import it).
"""
