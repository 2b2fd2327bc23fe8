"""The two float32 kernels that define the model's input contract numerically, and the one that approximates it.

Training (``models/``), evaluation and the serving pipelines all call :func:`window_to_unit` and
:func:`resize_area`, so what the model saw in training is bit-for-bit what it sees in service. Do not change
their names, signatures or numerics. :func:`resize_area_into` is the allocation-free form the hot path uses.
:func:`recentre_lowpass` turns a JPEG 2000 frame's half-resolution low-pass band into a close stand-in for the
2 x 2 area means, for models whose manifest was validated on it (docs/dicom.md).
"""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image

__all__ = ["recentre_lowpass", "resize_area", "resize_area_into", "window_to_unit"]


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
        binned: np.ndarray = src.reshape(rows, fy, cols, fx).mean(axis=(1, 3), dtype=np.float32)
        return binned
    pil = Image.fromarray(src)  # float32 2-D -> mode "F"
    return np.asarray(pil.resize((cols, rows), Image.Resampling.BOX), dtype=np.float32)


# --------------------------------------------------------------------------------------------------------
# frame state and steps


def _bin_into(src: np.ndarray, dst: np.ndarray, fy: int, fx: int) -> None:
    """Write the ``fy x fx`` block means of ``src`` into ``dst`` in numpy's own summation order for short rows.

    Each block row is summed left to right, the row sums are added top to bottom, and the total is divided by
    ``fy * fx`` (for 2 x 2: ``(a00 + a01) + (a10 + a11)``).
    """
    tmp = np.empty_like(dst) if fy > 1 else dst
    for y in range(fy):
        acc = dst if y == 0 else tmp
        if fx == 1:
            np.copyto(acc, src[y::fy, ::1])
        else:
            np.add(src[y::fy, 0::fx], src[y::fy, 1::fx], out=acc)
        for x in range(2, fx):
            np.add(acc, src[y::fy, x::fx], out=acc)
        if y:
            np.add(dst, tmp, out=dst)
    np.true_divide(dst, np.float32(fy * fx), out=dst)


@functools.lru_cache(maxsize=64)
def _binning_matches_kernel(fy: int, fx: int, rows: int, cols: int) -> bool:
    """Return True when :func:`_bin_into` is bit-identical to :func:`resize_area` for these block factors.

    Checked once per (factors, output size up to 64 x 64) on a random probe (numpy's reduction order is not an
    API; it changes with the block's row length, e.g. pairwise summation from 8 elements on). The probe stays
    small whatever the image, so no input can make the check itself expensive.
    """
    rows, cols = min(rows, 64), min(cols, 64)
    probe = np.random.default_rng(20240101).standard_normal((rows * fy, cols * fx)).astype(np.float32)
    probe *= np.float32(1000)
    out = np.empty((rows, cols), np.float32)
    _bin_into(probe, out, fy, fx)
    return bool(np.array_equal(out, resize_area(probe, (rows, cols))))


# NOTE(preprocess): np.mean over the block axes costs ~2 ms for 512 -> 256 and ~4 ms for 1024 -> 256, the largest
# step on the hot path; the strided adds of _bin_into cost ~0.2 / ~0.5 ms. They are used only for shapes where
# they reproduce the kernel bit for bit (checked once per block size, and by tests/unit/test_preprocess.py).


def resize_area_into(src: np.ndarray, dst: np.ndarray) -> None:
    """Write ``resize_area(src, dst.shape)`` into ``dst`` (2-D float32) without an intermediate array.

    Bit-identical to :func:`resize_area`: the integer-factor branch is the verified strided binning or the
    same reduction with ``out=``, and other sizes go through :func:`resize_area` itself.
    """
    rows, cols = dst.shape
    h, w = src.shape
    if (h, w) == (rows, cols):
        np.copyto(dst, src)
    elif h % rows == 0 and w % cols == 0:
        fy, fx = h // rows, w // cols
        if _binning_matches_kernel(fy, fx, rows, cols):
            _bin_into(src, dst, fy, fx)
        else:
            np.mean(src.reshape(rows, fy, cols, fx), axis=(1, 3), dtype=np.float32, out=dst)
    else:
        dst[...] = resize_area(src, (rows, cols))


def recentre_lowpass(band: np.ndarray) -> None:
    """Move a 5/3 level-1 low-pass band (2-D float32) a quarter of its pixel down and right, in place.

    Sample ``n`` of the band is centred on full-resolution pixel ``2n``, while the 2 x 2 area mean it stands in
    for is centred on ``2n + 0.5``: a quarter of a band pixel. Linear interpolation, ``0.75 b[n] + 0.25 b[n+1]``
    along each axis with the last row and column kept, moves it there. On the held-out seed this brings the
    model input within a mean of 0.0038 (p99 0.041) of the area-resize contract, against 0.0085 (p99 0.14)
    unmoved (docs/dicom.md, "JPEG 2000 at the model's resolution").
    """
    for axis in (0, 1):
        head = band[:-1] if axis == 0 else band[:, :-1]
        tail = band[1:] if axis == 0 else band[:, 1:]
        quarter = tail * np.float32(0.25)  # a copy: head and tail overlap
        head *= np.float32(0.75)
        head += quarter
