"""Preprocessing kernels: float32 image math shared by the daemon and the model build.

These two kernels define the model's input contract numerically. Training (``models/``), evaluation and the
serving pipelines all call them, so what the model saw in training is bit-for-bit what it sees in service.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

__all__ = ["resize_area", "window_to_unit"]


def window_to_unit(
    values: np.ndarray, center: float, width: float, out: np.ndarray | None = None
) -> np.ndarray:
    """Return ``clip((values - (center - width/2)) / width, 0, 1)`` as float32.

    Args:
        values: modality values (HU for CT), any real dtype.
        center: window center in modality units.
        width: window width in modality units, >= 1.
        out: optional float32 array of the same shape to write into.
    """
    if width < 1:
        raise ValueError(f"window width must be >= 1, got {width}")
    lo = np.float32(center - width / 2.0)
    inv = np.float32(1.0 / width)
    if out is None:
        out = np.empty(values.shape, dtype=np.float32)
    np.subtract(values, lo, out=out, dtype=np.float32, casting="unsafe")
    np.multiply(out, inv, out=out)
    np.clip(out, 0.0, 1.0, out=out)
    return out


def resize_area(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Return ``image`` (2-D) resized to ``size`` = (rows, cols) by area averaging, as float32.

    Area (box) averaging is the right filter for downsampling CT: a small nodule keeps its mean density
    instead of aliasing. Upsampling uses the same box filter (nearest-like), which is acceptable for the
    rare small inputs.
    """
    rows, cols = size
    src = np.ascontiguousarray(image, dtype=np.float32)
    if src.shape == (rows, cols):
        return src.copy()
    h, w = src.shape
    if h % rows == 0 and w % cols == 0:
        fy, fx = h // rows, w // cols
        return src.reshape(rows, fy, cols, fx).mean(axis=(1, 3), dtype=np.float32)
    pil = Image.fromarray(src)  # float32 2-D -> mode "F"
    return np.asarray(pil.resize((cols, rows), Image.Resampling.BOX), dtype=np.float32)
