"""Export the trained network to ONNX (opset 21, fixed batch), torch at build time only.

BatchNorm is folded into the preceding convolutions, weights smaller than 1e-30 in magnitude are flushed to
zero (no subnormal floats in the file), and the graph takes ``image`` [B, 1, H, W] float32 and returns
``prob`` [B, 1] and ``heatmap`` [B, g, g], sigmoids inside.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

__all__ = ["INPUT_NAME", "OUTPUT_NAMES", "export_onnx"]

log = logging.getLogger(__name__)

INPUT_NAME = "image"
OUTPUT_NAMES = ("prob", "heatmap")
OPSET = 21


def _fold_bn(model: Any) -> None:
    """Fold every Conv2d + BatchNorm2d pair of ``model.stem`` in place (BN becomes Identity)."""
    import torch
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    layers = list(model.stem)
    for i in range(len(layers) - 1):
        if isinstance(layers[i], torch.nn.Conv2d) and isinstance(layers[i + 1], torch.nn.BatchNorm2d):
            layers[i] = fuse_conv_bn_eval(layers[i], layers[i + 1])
            layers[i + 1] = torch.nn.Identity()
    model.stem = torch.nn.Sequential(*layers)


def export_onnx(state: dict[str, Any], net_cfg: Any, path: Path, *, batch: int = 8) -> None:
    """Write the FP32 ONNX model for ``state`` to ``path``.

    Args:
        state: the trained state_dict.
        net_cfg: the :class:`~appliance.modelbuild.net.NetConfig` it was trained with.
        path: output file (weights inline, no external data).
        batch: the fixed batch size compiled into the graph.
    """
    import onnx
    import torch

    from appliance.modelbuild.net import Exported, NoduleNet

    model = NoduleNet(net_cfg)
    model.load_state_dict(state)
    model.eval()
    _fold_bn(model)
    with torch.no_grad():
        flushed = 0
        for p in model.parameters():
            tiny = (p.abs() < 1e-30) & (p != 0)
            flushed += int(tiny.sum())
            p[tiny] = 0.0
    log.info("export: flushed %d subnormal-range weights to zero", flushed)
    x = torch.zeros(batch, 1, net_cfg.image, net_cfg.image)
    program = torch.onnx.export(
        Exported(model).eval(), (x,), dynamo=True, opset_version=OPSET,
        input_names=[INPUT_NAME], output_names=list(OUTPUT_NAMES), optimize=True, verbose=False,
    )
    proto = program.model_proto
    proto.producer_name = "edge-appliance.modelbuild"
    proto.doc_string = "ct-nodule reference model (synthetic data; not for clinical use)"
    onnx.checker.check_model(proto, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, str(path), save_as_external_data=False)
    log.info("export: wrote %s (%d bytes)", path, path.stat().st_size)
