"""INT4 weight-only quantization in the QDQ form TensorRT and ONNX Runtime both read, and its inspection.

Every MatMul whose right operand is a constant 2-D weight gets an INT4 ``DequantizeLinear`` (opset 21):
symmetric (no zero point), blocked along K (``axis = 0``) with ``block_size``. Convolutions, attention
MatMuls between activations, and the positional embedding stay FP32. No ``com.microsoft`` op is written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = ["Int4Report", "inspect_int4", "quantize_int4"]

log = logging.getLogger(__name__)


def quantize_int4(fp32_path: Path, out_path: Path, block_size: int) -> None:
    """Write the INT4 QDQ model of ``fp32_path`` to ``out_path``.

    Args:
        fp32_path: the FP32 ONNX model.
        out_path: where to write the INT4 model (weights inline).
        block_size: elements per quantization block along K (32, 64 or 128; must divide every K).
    """
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)  # one INFO line per node
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    model = onnx.load(str(fp32_path))
    cfg = DefaultWeightOnlyQuantConfig(
        block_size=block_size, is_symmetric=True, quant_format=QuantFormat.QDQ, bits=4,
        op_types_to_quantize=("MatMul",),
    )
    quantizer = MatMulNBitsQuantizer(model, algo_config=cfg)
    quantizer.process()
    q = quantizer.model.model
    q.producer_name = "edge-appliance.modelbuild"
    bad = sorted({n.op_type for n in q.graph.node if n.domain not in ("", "ai.onnx")})
    if bad:
        raise RuntimeError(f"INT4 model {out_path} contains non-standard ops {bad}")
    onnx.checker.check_model(q, full_check=True)
    onnx.save_model(q, str(out_path), save_as_external_data=False)
    log.info("quantize: wrote %s (block %d, %d bytes)", out_path, block_size, out_path.stat().st_size)


@dataclass(frozen=True)
class Int4Report:
    """What :func:`inspect_int4` found in a graph."""

    opset: int  # default-domain opset
    dq_nodes: int  # DequantizeLinear nodes with an INT4 input
    axes: frozenset[int]  # their axis attributes
    block_sizes: frozenset[int]  # their block_size attributes
    zero_points: int  # DQ nodes that have a zero point input
    weight_matmuls: int  # MatMuls fed by a DQ
    float_weight_matmuls: int  # MatMuls whose B operand is still a float initializer
    quantized_params: int  # weights held as INT4
    float_params: int  # weights held as float (conv, biases, norms, embeddings)
    foreign_ops: frozenset[str]  # ops outside the default domain
    input_shapes: dict[str, list[int | str]]  # graph inputs
    output_shapes: dict[str, list[int | str]]  # graph outputs

    @property
    def fraction_quantized(self) -> float:
        """Share of all weight parameters stored as INT4."""
        total = self.quantized_params + self.float_params
        return self.quantized_params / total if total else 0.0


def _shape(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]


def inspect_int4(model: onnx.ModelProto | Path) -> Int4Report:
    """Return the INT4 structure of a model (works on the FP32 model too: no DQ nodes).

    Args:
        model: an ONNX model or its path.
    """
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    dq_out: dict[str, onnx.NodeProto] = {}
    axes, blocks = set(), set()
    zps = q_params = 0
    int4_names = set()
    for n in g.node:
        if n.op_type != "DequantizeLinear" or n.input[0] not in inits:
            continue
        if inits[n.input[0]].data_type not in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        axes.add(int(attrs.get("axis", 1)))
        blocks.add(int(attrs.get("block_size", 0)))
        if len(n.input) > 2 and n.input[2]:
            zps += 1
        dq_out[n.output[0]] = n
        int4_names.add(n.input[0])
        q_params += int(np.prod(inits[n.input[0]].dims))
    wmm = fmm = 0
    for n in g.node:
        if n.op_type in ("MatMul", "Gemm"):
            if n.input[1] in dq_out:
                wmm += 1
            elif n.input[1] in inits:
                fmm += 1
    f_params = 0
    for name, t in inits.items():
        if name in int4_names or t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            continue
        if any(name == n.input[1] for n in g.node if n.op_type == "DequantizeLinear"):
            continue  # scales
        arr = numpy_helper.to_array(t)
        if arr.size > 1:
            f_params += int(arr.size)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return Int4Report(
        opset=opset,
        dq_nodes=len(dq_out),
        axes=frozenset(axes),
        block_sizes=frozenset(blocks),
        zero_points=zps,
        weight_matmuls=wmm,
        float_weight_matmuls=fmm,
        quantized_params=q_params,
        float_params=f_params,
        foreign_ops=frozenset(f"{n.domain}.{n.op_type}" for n in g.node if n.domain not in ("", "ai.onnx")),
        input_shapes={i.name: _shape(i) for i in g.input if i.name not in inits},
        output_shapes={o.name: _shape(o) for o in g.output},
    )
