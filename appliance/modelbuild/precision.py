"""Strongly typed GPU artifacts derived from the FP32 graph: FP16 and W4A16 (INT4 weights, FP16 activations).

TensorRT 10+ networks are strongly typed: the precision of every layer is the type its tensors have in the
ONNX graph, and TensorRT 11 has no builder flag left to lower it (docs/gpu.md, "Precision lives in the graph").
So the GPU artifacts carry their precision themselves:

* ``fp16``: every float tensor and initializer is FLOAT16. The graph's input and outputs stay FLOAT32 (one
  ``Cast`` after the input and one before each output), so the engine contract (float32 ``[B, 1, H, W]`` in,
  float32 outputs) is the same for every artifact and the manifest's I/O spec holds for all of them.
* ``w4a16``: the INT4 artifact's exact weights (symmetric, block-wise ``DequantizeLinear`` on axis 0, no zero
  point, :func:`appliance.modelbuild.quantize.quantize_int4`) with FLOAT16 scales, so each DQ yields FLOAT16
  and every GEMM runs with FP16 activations. Same float32 I/O boundary as ``fp16``.

Both are derived deterministically from the committed FP32 file (no retraining) by :func:`derive_fp16` and
:func:`derive_w4a16`; ``appliance models derive ct-nodule`` writes them and records them in ``model.toml``.
The converter is ``onnxruntime.transformers.float16`` (shipped inside onnxruntime, no extra dependency).
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx

__all__ = ["TypeReport", "derive_fp16", "derive_w4a16", "inspect_types"]

log = logging.getLogger(__name__)

_F32, _F16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16


def _to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    # op_block_list=[]: no op of this graph is kept in FP32 (the default list names only ML/NMS ops anyway).
    # keep_io_types: Cast at the boundary, so inputs/outputs stay float32 as in the manifest.
    out: onnx.ModelProto = convert_float_to_float16(model, keep_io_types=True, op_block_list=[])
    out.producer_name = "edge-appliance.modelbuild"
    out.doc_string = ""
    _toposort(out.graph)  # the converter appends its boundary Casts at the end of the node list
    return out


def _toposort(graph: onnx.GraphProto) -> None:
    """Reorder ``graph.node`` so every node follows the producers of its inputs (stable otherwise)."""
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        rest = []
        for n in pending:
            if all(i in ready for i in n.input):
                ordered.append(n)
                ready.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            raise RuntimeError(f"graph has a cycle or a dangling input near node {rest[0].name!r}")
        pending = rest
    copies = [onnx.NodeProto.FromString(n.SerializeToString()) for n in ordered]
    del graph.node[:]
    graph.node.extend(copies)


def _save(model: onnx.ModelProto, out_path: Path) -> None:
    onnx.checker.check_model(model, full_check=True)
    onnx.save_model(model, str(out_path), save_as_external_data=False)


def derive_fp16(fp32_path: Path, out_path: Path) -> None:
    """Write the FP16 artifact of ``fp32_path`` (float32 I/O, FLOAT16 everywhere inside) to ``out_path``."""
    model = _to_fp16(onnx.load(str(fp32_path)))
    report = inspect_types(model)
    if not report.strongly_fp16:
        raise RuntimeError(f"FP16 conversion of {fp32_path} left float32 tensors: {report.float32_internal[:5]}")
    _save(model, out_path)
    log.info("precision: wrote %s (%d bytes)", out_path, out_path.stat().st_size)


def derive_w4a16(fp32_path: Path, out_path: Path, block_size: int) -> None:
    """Write the W4A16 artifact: INT4 QDQ weights (as the int4 artifact) with FP16 scales and activations.

    Args:
        fp32_path: the FP32 ONNX model.
        out_path: where to write the W4A16 model.
        block_size: INT4 block size along K (use the int4 artifact's, so the INT4 weights are identical).
    """
    from appliance.modelbuild.quantize import inspect_int4, quantize_int4

    with tempfile.TemporaryDirectory(prefix="w4a16-") as tmp:
        q_path = Path(tmp) / "int4.onnx"
        quantize_int4(fp32_path, q_path, block_size)
        model = _to_fp16(onnx.load(str(q_path)))
    report = inspect_types(model)
    if not report.strongly_fp16:
        raise RuntimeError(f"W4A16 conversion of {fp32_path} left float32 tensors: {report.float32_internal[:5]}")
    q = inspect_int4(model)
    if q.dq_nodes == 0 or q.zero_points or q.foreign_ops:
        raise RuntimeError(f"W4A16 graph lost its symmetric INT4 DequantizeLinear weights: {q}")
    _save(model, out_path)
    log.info("precision: wrote %s (block %d, %d bytes)", out_path, block_size, out_path.stat().st_size)


@dataclass(frozen=True)
class TypeReport:
    """Float types in a graph: what a strongly typed builder will run each tensor in."""

    io_types: dict[str, str]  # graph input/output name -> element type name
    float32_internal: list[str]  # float32 tensors that are neither graph I/O nor the boundary casts' inputs
    float16_tensors: int  # tensors (values and initializers) of type FLOAT16
    casts: int  # Cast nodes
    dq_output_types: frozenset[str]  # element types DequantizeLinear nodes produce (their scale type)

    @property
    def strongly_fp16(self) -> bool:
        """True if every float tensor inside the graph is FLOAT16 (float32 only at the I/O boundary)."""
        return not self.float32_internal and self.float16_tensors > 0


def inspect_types(model: onnx.ModelProto | Path) -> TypeReport:
    """Infer every tensor's type and report where float32 survives (works on any of the artifacts)."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    g = inferred.graph
    types: dict[str, int] = {}
    for vi in [*g.input, *g.output, *g.value_info]:
        types[vi.name] = vi.type.tensor_type.elem_type
    for t in g.initializer:
        types[t.name] = t.data_type
    io = {vi.name for vi in [*g.input, *g.output]}
    boundary = set(io)  # a Cast from/to a graph I/O tensor is the float32 boundary
    for n in g.node:
        if n.op_type == "Cast" and (n.input[0] in io or n.output[0] in io):
            boundary.update([n.input[0], *n.output])
    name = onnx.TensorProto.DataType.Name
    dq_types = frozenset(name(types.get(n.input[1], 0)) for n in g.node if n.op_type == "DequantizeLinear")
    return TypeReport(
        io_types={k: name(types[k]) for k in sorted(io)},
        float32_internal=sorted(k for k, v in types.items() if v == _F32 and k not in boundary),
        float16_tensors=sum(1 for v in types.values() if v == _F16),
        casts=sum(1 for n in g.node if n.op_type == "Cast"),
        dq_output_types=dq_types,
    )
