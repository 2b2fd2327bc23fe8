"""The preprocessing steps a pipeline may name, in the one order they run (:data:`STEPS`).

Every step writes float32 in place in one full-resolution scratch buffer (:class:`Frame`); the resize writes
into the caller's batch slot. pydicom's float64 LUT helpers are not used (docs/dicom.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from appliance.dicom import DicomInstance, tag_name
from appliance.errors import DicomError
from appliance.pipeline.kernels import resize_area_into, window_to_unit

__all__ = ["NUMBER", "ORDER", "REQUIRED", "STEPS", "Frame", "FrameInfo", "Step", "StepSpec", "load_frame"]


LUMA = np.asarray([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R BT.601, as YBR_FULL defines Y


@dataclass(frozen=True)
class FrameInfo:
    """What the caller needs to map model outputs back onto the original frame."""

    original_shape: tuple[int, int]  # (rows, columns) of the frame before resize
    pixel_spacing: tuple[float, float] | None  # mm (row, column) of the original frame, when the file has it
    scale_to_original: tuple[float, float]  # (rows / H, columns / W): original pixels per model pixel
    lossy: bool = False  # the pixels went through lossy compression (8-bit lossy CT is not diagnostic-grade)

    def to_original(self, row: float, col: float) -> tuple[float, float]:
        """Return the original-frame (row, col) of the centre of model-input pixel (row, col)."""
        sy, sx = self.scale_to_original
        return (row + 0.5) * sy - 0.5, (col + 0.5) * sx - 0.5


class Frame:
    """Mutable state of one frame going through the steps (one per :meth:`Pipeline.run` call)."""

    __slots__ = ("colour", "image", "index", "inst", "out", "resized", "stored")

    def __init__(self, inst: DicomInstance, index: int, stored: np.ndarray, out: np.ndarray) -> None:
        self.inst = inst
        self.index = index
        self.stored = stored  # decoded stored values (grey frames only; colour frames are already luma)
        self.colour = False  # the image was converted from colour: no modality LUT applies
        self.image: np.ndarray = np.empty((inst.rows, inst.columns), dtype=np.float32)  # full-res scratch
        self.out = out  # the caller's slot, (C, H, W)
        self.resized = False


def _step_modality_lut(fr: Frame, params: Mapping[str, Any]) -> None:
    """Stored values -> modality units (HU for CT), in place, float32."""
    if fr.colour or fr.inst.pixel_keyword != "PixelData":
        return  # colour has no modality LUT; float pixel data is already in real-world units
    lut = fr.inst.modality_lut
    if lut is not None:
        first, table = lut
        idx = np.subtract(fr.stored, first, dtype=np.int64)
        np.clip(idx, 0, table.shape[0] - 1, out=idx)
        np.take(table, idx, out=fr.image)
        return
    slope, intercept = fr.inst.rescale(fr.index)
    if slope != 1.0:
        np.multiply(fr.image, np.float32(slope), out=fr.image)
    if intercept != 0.0:
        np.add(fr.image, np.float32(intercept), out=fr.image)


def _step_window(fr: Frame, params: Mapping[str, Any]) -> None:
    """Linear window to [0, 1] with :func:`window_to_unit`; the file's VOI when asked and usable."""
    center, width = float(params["center"]), float(params["width"])
    if params["source"] == "file":
        voi = fr.inst.voi_window(fr.index)
        if voi is not None:
            center, width = voi
    window_to_unit(fr.image, center, width, out=fr.image)


def _step_invert_monochrome1(fr: Frame, params: Mapping[str, Any]) -> None:
    """MONOCHROME1 (minimum is white) -> MONOCHROME2 on [0, 1] data: ``1 - x``."""
    if fr.inst.photometric == "MONOCHROME1":
        np.subtract(np.float32(1.0), fr.image, out=fr.image)


def _step_resize(fr: Frame, params: Mapping[str, Any]) -> None:
    """Area resize to the model's H x W, straight into every channel of the slot."""
    resize_area_into(fr.image, fr.out[0])
    for c in range(1, fr.out.shape[0]):
        np.copyto(fr.out[c], fr.out[0])
    fr.image = fr.out
    fr.resized = True


def _step_normalize(fr: Frame, params: Mapping[str, Any]) -> None:
    """``none`` leaves the windowed [0, 1] values; ``meanstd`` applies ``(x - mean) / std``."""
    if params["kind"] == "meanstd":
        np.subtract(fr.image, np.float32(params["mean"]), out=fr.image)
        np.multiply(fr.image, np.float32(1.0 / float(params["std"])), out=fr.image)


@dataclass(frozen=True)
class StepSpec:
    """A registered step: its function, parameters (name -> (types, default)) and a parameter check."""

    name: str
    apply: Callable[[Frame, Mapping[str, Any]], None]
    params: Mapping[str, tuple[tuple[type, ...], Any]]  # default REQUIRED means the key must be given
    check: Callable[[Mapping[str, Any]], str | None] | None = None  # returns "key: problem" or None


REQUIRED = object()
NUMBER = (int, float)


def _check_window(p: Mapping[str, Any]) -> str | None:
    if p["source"] not in ("pipeline", "file"):
        return f"source: must be 'pipeline' or 'file', got {p['source']!r}"
    if not math.isfinite(p["center"]):
        return "center: must be finite"
    if not (math.isfinite(p["width"]) and p["width"] >= 1):
        return f"width: must be >= 1, got {p['width']!r}"
    return None


def _check_resize(p: Mapping[str, Any]) -> str | None:
    return None if p["method"] == "area" else f"method: only 'area' is implemented, got {p['method']!r}"


def _check_normalize(p: Mapping[str, Any]) -> str | None:
    if p["kind"] not in ("none", "meanstd"):
        return f"kind: must be 'none' or 'meanstd', got {p['kind']!r}"
    if p["kind"] == "meanstd" and not (math.isfinite(p["std"]) and p["std"] > 0):
        return f"std: must be > 0, got {p['std']!r}"
    return None


STEPS: Mapping[str, StepSpec] = MappingProxyType(
    {
        "modality_lut": StepSpec("modality_lut", _step_modality_lut, {}),
        "window": StepSpec(
            "window",
            _step_window,
            {"center": (NUMBER, REQUIRED), "width": (NUMBER, REQUIRED), "source": ((str,), "pipeline")},
            _check_window,
        ),
        "invert_monochrome1": StepSpec("invert_monochrome1", _step_invert_monochrome1, {}),
        "resize": StepSpec("resize", _step_resize, {"method": ((str,), "area")}, _check_resize),
        "normalize": StepSpec(
            "normalize",
            _step_normalize,
            {"kind": ((str,), "none"), "mean": (NUMBER, 0.0), "std": (NUMBER, 1.0)},
            _check_normalize,
        ),
    }
)
"""The step registry, in the one order steps run. Register new steps here (import time only)."""

ORDER = {name: i for i, name in enumerate(STEPS)}


@dataclass(frozen=True)
class Step:
    """One configured step of a pipeline."""

    spec: StepSpec
    params: Mapping[str, Any]  # read-only, defaults filled in

    @property
    def name(self) -> str:
        """The registry name."""
        return self.spec.name


def load_frame(fr: Frame, arr: np.ndarray, photometric: str) -> None:
    """Copy the decoded frame into the float32 scratch; colour and palette frames become luma."""
    if arr.ndim == 3:
        fr.colour = True
        if photometric.startswith("YBR_FULL") or photometric.startswith("YBR_PARTIAL"):
            np.copyto(fr.image, arr[..., 0], casting="unsafe")  # Y is the luma already
        else:
            np.matmul(arr.astype(np.float32), LUMA, out=fr.image)
        return
    if photometric == "PALETTE COLOR":
        fr.colour = True
        np.matmul(_palette_rgb(fr.inst, arr).astype(np.float32), LUMA, out=fr.image)
        return
    np.copyto(fr.image, arr, casting="unsafe")
    if fr.inst.pixel_keyword != "PixelData" and not np.isfinite(fr.image).all():
        raise DicomError(f"{tag_name(fr.inst.pixel_keyword)} frame {fr.index} contains NaN or infinity",
                         field=f"dicom.{fr.inst.pixel_keyword}")


def _palette_rgb(inst: DicomInstance, arr: np.ndarray) -> np.ndarray:
    from pydicom.pixels.processing import apply_color_lut

    try:
        return np.asarray(apply_color_lut(arr, inst.dataset))
    except Exception as e:  # noqa: BLE001 - malformed palette tables are bad input
        raise DicomError(
            f"{tag_name('RedPaletteColorLookupTableDescriptor')} / palette tables are unusable: "
            f"{type(e).__name__}",
            field="dicom.RedPaletteColorLookupTableDescriptor",
        ) from e
