"""Preprocessing: the float32 kernels of the model's input contract, and pipelines built from named steps.

The two kernels :func:`window_to_unit` and :func:`resize_area` define the model's input contract numerically.
Training (``models/``), evaluation and the serving pipelines all call them, so what the model saw in training
is bit-for-bit what it sees in service. Do not change their names, signatures or numerics.

A :class:`Pipeline` (``pipelines/<name>.toml``) turns one frame of a validated
:class:`~appliance.dicom.DicomInstance` into one float32 batch slot. Its steps come from a small registry
(:data:`STEPS`) and always run in this order, each at most once::

    modality_lut        stored -> modality units (Rescale Slope/Intercept per frame, or the Modality LUT Seq.)
    window              the pipeline's fixed window (center/width, modality units) or the file's VOI -> [0, 1]
    invert_monochrome1  1 - x for MONOCHROME1 (pydicom's presentation LUT does not do it; docs/dicom.md)
    resize              area resize to the model's H x W, written straight into the batch slot
    normalize           "none", or (x - mean) / std

Pipeline file format (``format_version = 1``)::

    format_version = 1
    name = "ct-nodule"            # optional; defaults to the file stem
    model = "ct-nodule"           # models/<model>/model.toml supplies input_shape and the contract
    description = "..."

    [accept]                      # check(): anything else is NOT_APPLICABLE (FAILED_PRECONDITION)
    modalities = ["CT"]           # (0008,0060); omit to accept any
    sop_classes = ["CTImageStorage", "1.2.840.10008.5.1.4.1.1.2.1"]   # pydicom keywords or UIDs; omit = any
    colour = "reject"             # "reject" colour/palette images, or convert them to "luminance"

    [[steps]]
    name = "window"
    center = -600.0
    width = 1500.0
    source = "pipeline"           # or "file": the file's first VOI window when its width >= 1

Loading validates everything once (unknown key, step or parameter -> :class:`ConfigError` naming the file
and key) and refuses a pipeline that contradicts its model's ``[input.preprocess]`` contract (another window,
another resize, a missing MONOCHROME1 inversion, another normalisation).

Hot path: every step writes float32 in place in one full-resolution scratch buffer, then the resize writes
into the caller's slot; pydicom's float64 LUT helpers are not used (docs/dicom.md).
"""

from __future__ import annotations

import logging
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from PIL import Image
from pydicom import uid as _uid

from appliance.dicom import DicomInstance, tag_name
from appliance.errors import ConfigError, DicomError, ManifestError, NotApplicable
from appliance.manifest import Manifest, load_manifest

__all__ = [
    "STEPS",
    "FrameInfo",
    "Pipeline",
    "StepSpec",
    "load_pipeline",
    "load_pipelines",
    "resize_area",
    "window_to_unit",
]

logger = logging.getLogger(__name__)


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


# --------------------------------------------------------------------------------------------------------
# frame state and steps

_LUMA = np.asarray([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R BT.601, as YBR_FULL defines Y


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


class _Frame:
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


def _step_modality_lut(fr: _Frame, params: Mapping[str, Any]) -> None:
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


def _step_window(fr: _Frame, params: Mapping[str, Any]) -> None:
    """Linear window to [0, 1] with :func:`window_to_unit`; the file's VOI when asked and usable."""
    center, width = float(params["center"]), float(params["width"])
    if params["source"] == "file":
        voi = fr.inst.voi_window(fr.index)
        if voi is not None:
            center, width = voi
    window_to_unit(fr.image, center, width, out=fr.image)


def _step_invert_monochrome1(fr: _Frame, params: Mapping[str, Any]) -> None:
    """MONOCHROME1 (minimum is white) -> MONOCHROME2 on [0, 1] data: ``1 - x``."""
    if fr.inst.photometric == "MONOCHROME1":
        np.subtract(np.float32(1.0), fr.image, out=fr.image)


def _halve_into(src: np.ndarray, dst: np.ndarray) -> None:
    """2 x 2 block mean as ``(a00 + a01) + (a10 + a11)``, divided by 4: numpy's own reduction order."""
    np.add(src[0::2, 0::2], src[0::2, 1::2], out=dst)
    tmp = np.add(src[1::2, 0::2], src[1::2, 1::2])
    np.add(dst, tmp, out=dst)
    np.true_divide(dst, np.float32(4), out=dst)


def _halving_matches_kernel() -> bool:
    """Return True when :func:`_halve_into` is bit-identical to :func:`resize_area` with this numpy."""
    probe = np.random.default_rng(20240101).standard_normal((128, 96)).astype(np.float32) * np.float32(1000)
    out = np.empty((64, 48), np.float32)
    _halve_into(probe, out)
    return bool(np.array_equal(out, resize_area(probe, (64, 48))))


# NOTE(preprocess): np.mean over the block axes costs ~2 ms for 512 -> 256, the largest step on the hot path;
# four strided adds cost ~0.2 ms. They are used only if they reproduce the kernel bit for bit here (numpy's
# reduction order is not an API), checked once at import and by tests/test_preprocess.py.
_FAST_HALVING = _halving_matches_kernel()


def _resize_area_into(src: np.ndarray, dst: np.ndarray) -> None:
    """Write ``resize_area(src, dst.shape)`` into ``dst`` (2-D float32) without an intermediate array.

    Bit-identical to :func:`resize_area`: the integer-factor branch is the same reduction with ``out=`` (or
    the verified fast halving), and other sizes go through :func:`resize_area` itself.
    """
    rows, cols = dst.shape
    h, w = src.shape
    if (h, w) == (rows, cols):
        np.copyto(dst, src)
    elif _FAST_HALVING and (h, w) == (2 * rows, 2 * cols):
        _halve_into(src, dst)
    elif h % rows == 0 and w % cols == 0:
        np.mean(src.reshape(rows, h // rows, cols, w // cols), axis=(1, 3), dtype=np.float32, out=dst)
    else:
        dst[...] = resize_area(src, (rows, cols))


def _step_resize(fr: _Frame, params: Mapping[str, Any]) -> None:
    """Area resize to the model's H x W, straight into every channel of the slot."""
    _resize_area_into(fr.image, fr.out[0])
    for c in range(1, fr.out.shape[0]):
        np.copyto(fr.out[c], fr.out[0])
    fr.image = fr.out
    fr.resized = True


def _step_normalize(fr: _Frame, params: Mapping[str, Any]) -> None:
    """``none`` leaves the windowed [0, 1] values; ``meanstd`` applies ``(x - mean) / std``."""
    if params["kind"] == "meanstd":
        np.subtract(fr.image, np.float32(params["mean"]), out=fr.image)
        np.multiply(fr.image, np.float32(1.0 / float(params["std"])), out=fr.image)


@dataclass(frozen=True)
class StepSpec:
    """A registered step: its function, parameters (name -> (types, default)) and a parameter check."""

    name: str
    apply: Callable[[_Frame, Mapping[str, Any]], None]
    params: Mapping[str, tuple[tuple[type, ...], Any]]  # default _REQUIRED means the key must be given
    check: Callable[[Mapping[str, Any]], str | None] | None = None  # returns "key: problem" or None


_REQUIRED = object()
_NUM = (int, float)


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
            {"center": (_NUM, _REQUIRED), "width": (_NUM, _REQUIRED), "source": ((str,), "pipeline")},
            _check_window,
        ),
        "invert_monochrome1": StepSpec("invert_monochrome1", _step_invert_monochrome1, {}),
        "resize": StepSpec("resize", _step_resize, {"method": ((str,), "area")}, _check_resize),
        "normalize": StepSpec(
            "normalize",
            _step_normalize,
            {"kind": ((str,), "none"), "mean": (_NUM, 0.0), "std": (_NUM, 1.0)},
            _check_normalize,
        ),
    }
)
"""The step registry, in the one order steps run. Register new steps here (import time only)."""

_ORDER = {name: i for i, name in enumerate(STEPS)}


@dataclass(frozen=True)
class Step:
    """One configured step of a pipeline."""

    spec: StepSpec
    params: Mapping[str, Any]  # read-only, defaults filled in

    @property
    def name(self) -> str:
        """The registry name."""
        return self.spec.name


# --------------------------------------------------------------------------------------------------------
# pipeline


@dataclass(frozen=True)
class Accept:
    """What :meth:`Pipeline.check` lets through."""

    modalities: frozenset[str] | None  # (0008,0060) values; None = any
    sop_classes: frozenset[str] | None  # UIDs; None = any image class
    colour: str  # "reject" or "luminance"


@dataclass(frozen=True)
class Pipeline:
    """A loaded, validated, immutable preprocessing pipeline (``pipelines/<name>.toml``)."""

    name: str
    model: str  # model name: models/<model>/model.toml
    input_shape: tuple[int, ...]  # one batch item, (C, H, W), from the model manifest
    steps: tuple[Step, ...]  # in execution order
    accept: Accept
    path: Path  # the TOML file
    description: str = ""

    def __repr__(self) -> str:
        """Return the name, model, shape and step names."""
        steps = ", ".join(s.name for s in self.steps)
        return (f"Pipeline({self.name!r}, model={self.model!r}, input_shape={self.input_shape}, "
                f"steps=[{steps}])")

    def check(self, inst: DicomInstance) -> None:
        """Raise :class:`NotApplicable` (naming the tag) unless this pipeline can use ``inst``.

        Checks, in order: SOP class, modality and colour against ``[accept]``.
        """
        acc = self.accept
        if acc.sop_classes is not None and inst.sop_class_uid not in acc.sop_classes:
            accepted = ", ".join(sorted(_uid.UID(u).name for u in acc.sop_classes))
            raise NotApplicable(
                f"{tag_name('SOPClassUID')} '{_uid.UID(inst.sop_class_uid).name}' is not accepted by "
                f"pipeline {self.name!r} (accepts {accepted})"
            )
        if acc.modalities is not None and inst.modality not in acc.modalities:
            raise NotApplicable(
                f"{tag_name('Modality')} {inst.modality!r} is not accepted by pipeline {self.name!r} "
                f"(accepts {', '.join(sorted(acc.modalities))})"
            )
        if acc.colour == "reject" and inst.photometric not in ("MONOCHROME1", "MONOCHROME2"):
            raise NotApplicable(
                f"{tag_name('PhotometricInterpretation')} {inst.photometric!r} is colour; pipeline "
                f"{self.name!r} needs grayscale (MONOCHROME1/MONOCHROME2)"
            )

    def run(self, inst: DicomInstance, frame: int, out: np.ndarray) -> FrameInfo:
        """Decode frame ``frame`` of ``inst``, apply the steps, and write float32 into ``out``.

        Args:
            inst: a parsed instance that passed :meth:`check`.
            frame: frame index, 0-based.
            out: the batch slot, float32 of shape :attr:`input_shape` (a view into the batch buffer).

        Raises:
            DicomError: the frame cannot be decoded, or its values are unusable.
            ValueError: ``out`` has the wrong shape or dtype (a caller bug).
        """
        if out.shape != self.input_shape or out.dtype != np.float32:
            raise ValueError(f"out must be float32 {self.input_shape}, got {out.dtype} {out.shape}")
        arr, photometric = inst.decode_frame_raw(frame, raw=True)
        fr = _Frame(inst, frame, arr, out)
        _load(fr, arr, photometric)
        for step in self.steps:
            step.spec.apply(fr, step.params)
        if not np.isfinite(out).all():  # last guard: a model never sees NaN/inf, and bad input is no bug
            raise DicomError(
                f"frame {frame} gives non-finite model input; check {tag_name('RescaleSlope')} and "
                f"{tag_name('RescaleIntercept')}",
                field="dicom.RescaleSlope",
            )
        h, w = self.input_shape[-2:]
        return FrameInfo(
            original_shape=(inst.rows, inst.columns),
            pixel_spacing=inst.pixel_spacing,
            scale_to_original=(inst.rows / h, inst.columns / w),
            lossy=inst.lossy,
        )


def _load(fr: _Frame, arr: np.ndarray, photometric: str) -> None:
    """Copy the decoded frame into the float32 scratch; colour and palette frames become luma."""
    if arr.ndim == 3:
        fr.colour = True
        if photometric.startswith("YBR_FULL") or photometric.startswith("YBR_PARTIAL"):
            np.copyto(fr.image, arr[..., 0], casting="unsafe")  # Y is the luma already
        else:
            np.matmul(arr.astype(np.float32), _LUMA, out=fr.image)
        return
    if photometric == "PALETTE COLOR":
        fr.colour = True
        np.matmul(_palette_rgb(fr.inst, arr).astype(np.float32), _LUMA, out=fr.image)
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


# --------------------------------------------------------------------------------------------------------
# loading

_TOP_KEYS = frozenset({"format_version", "name", "model", "description", "accept", "steps"})
_ACCEPT_KEYS = frozenset({"modalities", "sop_classes", "colour"})


def _sop_class_uid(value: str, where: str) -> str:
    if value and all(part.isdigit() for part in value.split(".")):
        return value
    found = getattr(_uid, value, None)
    if isinstance(found, _uid.UID) and found.is_valid:
        return str(found)
    raise ConfigError(f"{where}: {value!r} is neither a UID nor a pydicom SOP class keyword")


def _str_list(table: Mapping[str, Any], key: str, where: str) -> list[str] | None:
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}.{key}: must be a non-empty list of strings (omit the key to accept any)")
    return value


def _load_accept(raw: Any, where: str) -> Accept:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a table")
    for key in raw:
        if key not in _ACCEPT_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(_ACCEPT_KEYS))})")
    modalities = _str_list(raw, "modalities", where)
    sop_classes = _str_list(raw, "sop_classes", where)
    colour = raw.get("colour", "reject")
    if colour not in ("reject", "luminance"):
        raise ConfigError(f"{where}.colour: must be 'reject' or 'luminance', got {colour!r}")
    return Accept(
        modalities=frozenset(modalities) if modalities is not None else None,
        sop_classes=(frozenset(_sop_class_uid(v, f"{where}.sop_classes") for v in sop_classes)
                     if sop_classes is not None else None),
        colour=colour,
    )


def _load_step(raw: Any, where: str) -> Step:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a table")
    name = raw.get("name")
    if name not in STEPS:
        raise ConfigError(f"{where}.name: {name!r} is not a known step (known: {', '.join(STEPS)})")
    spec = STEPS[name]
    where = f"{where} ({name})"
    params: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "name":
            continue
        if key not in spec.params:
            known = ", ".join(spec.params) or "none"
            raise ConfigError(f"{where}: unknown key {key!r} (known: {known})")
        types = spec.params[key][0]
        if isinstance(value, bool) or not isinstance(value, types):
            wanted = " or ".join(t.__name__ for t in types)
            raise ConfigError(f"{where}.{key}: must be {wanted}, got {value!r}")
        params[key] = float(value) if types is _NUM else value
    for key, (_types, default) in spec.params.items():
        if key not in params:
            if default is _REQUIRED:
                raise ConfigError(f"{where}: missing key {key!r}")
            params[key] = default
    if spec.check is not None and (problem := spec.check(params)):
        raise ConfigError(f"{where}.{problem}")
    return Step(spec, MappingProxyType(params))


def _load_steps(raw: Any, where: str) -> tuple[Step, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: [[steps]] must be a non-empty array of tables")
    steps = tuple(_load_step(item, f"{where}[{i}]") for i, item in enumerate(raw))
    for i in range(1, len(steps)):
        if _ORDER[steps[i].name] <= _ORDER[steps[i - 1].name]:
            raise ConfigError(
                f"{where}[{i}].name: {steps[i].name!r} after {steps[i - 1].name!r}; steps run once each, in "
                f"the order {', '.join(STEPS)}"
            )
    if "resize" not in {s.name for s in steps}:
        raise ConfigError(f"{where}: a 'resize' step is required (it writes the batch slot)")
    return steps


def _close(a: Any, b: Any) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=0.0, abs_tol=1e-6)
    except (TypeError, ValueError):
        return False


def _check_contract(steps: tuple[Step, ...], manifest: Manifest, where: str) -> None:
    """Refuse a pipeline whose steps contradict the model's ``[input.preprocess]`` contract."""
    pre = manifest.input.preprocess
    by_name = {s.name: s.params for s in steps}
    model = f"model {manifest.name!r} [input.preprocess]"

    def need(step: str, why: str) -> Mapping[str, Any]:
        if step not in by_name:
            raise ConfigError(f"{where}: steps: {model} {why}, but the pipeline has no {step!r} step")
        return by_name[step]

    if "window_center" in pre or "window_width" in pre:
        need("modality_lut", "windows in modality units")
        win = need("window", "has a fixed window")
        if win["source"] != "pipeline":
            raise ConfigError(
                f"{where}: steps (window).source: 'file' contradicts the fixed window of {model}"
            )
        for key, mkey in (("center", "window_center"), ("width", "window_width")):
            if not _close(win[key], pre.get(mkey)):
                raise ConfigError(
                    f"{where}: steps (window).{key} = {win[key]} contradicts {model} {mkey} = {pre.get(mkey)}"
                )
    if "resize" in pre and need("resize", f"resizes with {pre['resize']!r}")["method"] != pre["resize"]:
        raise ConfigError(
            f"{where}: steps (resize).method = {by_name['resize']['method']!r} contradicts {model} "
            f"resize = {pre['resize']!r}"
        )
    if pre.get("photometric") == "MONOCHROME2":
        need("invert_monochrome1", "expects MONOCHROME2")
    _check_normalize_contract(by_name.get("normalize"), pre, where, model)


def _check_normalize_contract(norm: Mapping[str, Any] | None, pre: Mapping[str, Any], where: str,
                              model: str) -> None:
    kind = "none" if norm is None else norm["kind"]
    wanted = pre.get("normalize")
    if wanted is None:
        return
    if wanted == "window_unit":
        if kind != "none":
            raise ConfigError(
                f"{where}: steps (normalize).kind = {kind!r} contradicts {model} normalize = 'window_unit' "
                "(the window already gives [0, 1]; use kind = 'none')"
            )
        return
    if wanted == "meanstd":
        if norm is None or kind != "meanstd" or not (
            _close(norm["mean"], pre.get("mean")) and _close(norm["std"], pre.get("std"))
        ):
            raise ConfigError(
                f"{where}: steps (normalize) must be kind 'meanstd' with the mean/std of {model}"
            )
        return
    raise ConfigError(f"{where}: {model} normalize = {wanted!r} is not supported by any step")


def load_pipeline(path: Path, models_dir: Path) -> Pipeline:
    """Load and validate one pipeline file against the manifest of the model it names.

    Args:
        path: ``pipelines/<name>.toml``.
        models_dir: the directory holding ``<model>/model.toml``.

    Raises:
        ConfigError: the file is unreadable or invalid, or contradicts its model; the message names the file
            and key.
    """
    path = Path(path)
    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"pipeline file {where} not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{where}: cannot read TOML: {e}") from e
    for key in raw:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(_TOP_KEYS))})")
    if raw.get("format_version", 1) != 1:
        raise ConfigError(f"{where}: format_version must be 1, got {raw.get('format_version')!r}")
    name = raw.get("name", path.stem)
    model = raw.get("model")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: name must be a non-empty string")
    if not isinstance(model, str) or not model or "/" in model or model.startswith("."):
        raise ConfigError(f"{where}: model must be a model directory name, got {model!r}")
    try:
        manifest = load_manifest(Path(models_dir) / model / "model.toml")
    except ManifestError as e:
        raise ConfigError(f"{where}: model = {model!r}: {e}") from e
    steps = _load_steps(raw.get("steps"), f"{where}: steps")
    _check_contract(steps, manifest, where)
    item_shape = tuple(manifest.input.item_shape)
    if len(item_shape) != 3:
        raise ConfigError(f"{where}: model {model!r} input item shape {item_shape} is not (C, H, W)")
    description = raw.get("description", "")
    return Pipeline(
        name=name,
        model=model,
        input_shape=item_shape,
        steps=steps,
        accept=_load_accept(raw.get("accept", {}), f"{where}: [accept]"),
        path=path,
        description=description if isinstance(description, str) else "",
    )


def load_pipelines(pipelines_dir: Path, models_dir: Path) -> dict[str, Pipeline]:
    """Load every ``*.toml`` in ``pipelines_dir``, by pipeline name.

    Raises:
        ConfigError: any file is invalid, or two files declare the same name.
    """
    pipelines: dict[str, Pipeline] = {}
    for path in sorted(Path(pipelines_dir).glob("*.toml")):
        pipeline = load_pipeline(path, models_dir)
        if pipeline.name in pipelines:
            raise ConfigError(
                f"{path}: name {pipeline.name!r} is already used by {pipelines[pipeline.name].path}"
            )
        pipelines[pipeline.name] = pipeline
        logger.info("pipeline %s: model %s, input %s, steps %s", pipeline.name, pipeline.model,
                    pipeline.input_shape, [s.name for s in pipeline.steps])
    return pipelines
