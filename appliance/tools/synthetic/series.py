"""Synthetic slices and series with their ground truth, and the stored and model-input values derived from them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydicom.uid import generate_uid

from appliance.pipeline.kernels import resize_area, window_to_unit
from appliance.tools.synthetic.phantom import (
    Anatomy,
    ellipse_mask,
    nodule_params,
    render,
    sample_anatomy,
    sample_nodule,
)

__all__ = ["HU_MAX", "HU_MIN", "NODULE_MIN_DIAMETER_MM", "RESCALE_INTERCEPT", "SeriesInfo", "SliceTruth",
           "UID_ROOT", "generate_series", "generate_slice", "modality_values", "model_input", "phantom_uid",
           "stored_values"]

NODULE_MIN_DIAMETER_MM = 4.0  # a slice is positive iff it shows a nodule at least this wide
HU_MIN, HU_MAX = -1024.0, 3071.0  # representable with RescaleIntercept -1024 and 12 bits stored
RESCALE_INTERCEPT = -1024.0
UID_ROOT = "1.2.826.0.1.3680043.8.498."  # pydicom's root, as generate_uid uses by default


def phantom_uid(seed: int, *parts: object) -> str:
    """Return a UID derived from the seed (and ``parts``) under :data:`UID_ROOT`: reproducible, never real."""
    return generate_uid(prefix=UID_ROOT, entropy_srcs=["edge-appliance-phantom", str(seed), *map(str, parts)])


@dataclass(frozen=True)
class SeriesInfo:
    """Identity and geometry shared by every slice of one generated series."""

    seed: int  # the series seed; all UIDs derive from it
    study_uid: str
    series_uid: str
    frame_of_reference_uid: str
    series_number: int
    slice_thickness_mm: float


@dataclass(repr=False)
class SliceTruth:
    """One generated axial slice and its ground truth.

    ``hu`` is the phantom in HU before storage quantisation; :func:`stored_values` gives what a DICOM file
    stores and :func:`modality_values` what a reader recovers (stored * slope + intercept).
    """

    hu: np.ndarray  # float32 [rows, cols], HU before storage quantisation
    pixel_spacing_mm: tuple[float, float]  # (row, col) spacing
    has_nodule: bool  # True iff a nodule >= NODULE_MIN_DIAMETER_MM is visible in this slice
    nodules: list[tuple[float, float, float, float]]  # (row, col, diameter_mm, hu), pixel coordinates
    seed: int = 0  # the slice's seed (UIDs derive from it)
    z_mm: float = 0.0  # table position (ImagePositionPatient z)
    slice_thickness_mm: float = 1.25
    instance_number: int = 1
    series: SeriesInfo | None = None  # set for slices of a series
    contrast: bool = False  # intravenous contrast (bright vessels)
    noise_hu: float = 0.0  # noise standard deviation used
    extra: dict[str, Any] = field(default_factory=dict)  # free-form generation parameters

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols)."""
        return (int(self.hu.shape[0]), int(self.hu.shape[1]))

    @property
    def max_nodule_mm(self) -> float:
        """Diameter of the largest visible nodule, 0 if none."""
        return max((n[2] for n in self.nodules), default=0.0)

    def __repr__(self) -> str:
        return (
            f"SliceTruth(shape={self.shape}, spacing={self.pixel_spacing_mm[0]:.3f}mm, "
            f"has_nodule={self.has_nodule}, nodules={len(self.nodules)}, seed={self.seed})"
        )


def _as_rng(rng_or_seed: np.random.Generator | int) -> tuple[np.random.Generator, int]:
    if isinstance(rng_or_seed, np.random.Generator):
        seed = int(rng_or_seed.integers(0, 2**31 - 1))
        return np.random.default_rng(seed), seed
    seed = int(rng_or_seed)
    return np.random.default_rng(seed), seed


def generate_slice(
    rng_or_seed: np.random.Generator | int,
    *,
    nodule: bool | None = None,
    size: int | None = None,
    min_diameter_mm: float = NODULE_MIN_DIAMETER_MM,
    max_diameter_mm: float = 30.0,
    p_nodule: float = 0.5,
) -> SliceTruth:
    """Return one synthetic axial chest CT slice with its ground truth.

    Args:
        rng_or_seed: a seed (the slice is a pure function of it) or a Generator (one integer is drawn from it
            and used as the seed).
        nodule: force a positive (True) or negative (False) slice; None draws positive with ``p_nodule``.
        size: matrix size (rows = cols); None draws 512 mostly, sometimes 256/384/640/768.
        min_diameter_mm: smallest nodule diameter drawn for positives.
        max_diameter_mm: largest nodule diameter drawn for positives.
        p_nodule: probability of a positive slice when ``nodule`` is None.
    """
    rng, seed = _as_rng(rng_or_seed)
    an = sample_anatomy(rng, size)
    level = float(rng.uniform(0.45, 1.0))
    positive = bool(rng.random() < p_nodule) if nodule is None else bool(nodule)
    n_nod = int(rng.choice([1, 2, 3], p=[0.7, 0.2, 0.1])) if positive else 0
    # Nodule positions need the lung mask: render a throw-away mask first via a cheap geometric pass.
    sp = an.fov_mm / an.size
    coords0 = -(an.size / 2.0 - 0.5) * sp
    lung = _lung_mask(an, level)
    nods: list[tuple[float, float, float, float]] = []
    for _ in range(n_nod):
        d, hu = nodule_params(rng, min_diameter_mm, max_diameter_mm)
        centre = sample_nodule(rng, lung, coords0, sp, d)
        if centre is None:
            d = min_diameter_mm
            centre = sample_nodule(rng, lung, coords0, sp, d)
        if centre is not None:
            nods.append((centre[0], centre[1], d, hu))
    img, _, drawn = render(an, rng, level, nods)
    return SliceTruth(
        hu=img,
        pixel_spacing_mm=(sp, sp),
        has_nodule=bool(drawn),
        nodules=drawn,
        seed=seed,
        z_mm=float(-100.0 - 200.0 * level),
        contrast=an.contrast,
        noise_hu=an.noise_hu,
        extra={"fov_mm": an.fov_mm, "level": level},
    )


def _lung_mask(an: Anatomy, level: float) -> np.ndarray:
    """The lung mask exactly as :func:`render` computes it (without drawing)."""
    n = an.size
    sp = an.fov_mm / n
    coords = (np.arange(n, dtype=np.float32) - (n / 2.0 - 0.5)) * np.float32(sp)
    yy, xx = coords[:, None], coords[None, :]
    bcy, bcx, bry, brx = an.body
    inner = ellipse_mask(yy, xx, bcy, bcx, bry - an.fat_mm, brx - an.fat_mm)
    lung = np.zeros((n, n), dtype=bool)
    lry, lrx = an.lung_r[0] * bry * level, an.lung_r[1] * brx * math.sqrt(level)
    lcy = bcy + an.lung_y * bry
    for side in (-1.0, 1.0):
        lung |= ellipse_mask(yy, xx, lcy, bcx + side * an.lung_x * brx, lry, lrx)
    heart = ellipse_mask(yy, xx, bcy - 0.12 * bry, bcx + 0.06 * brx, 0.42 * bry * level, 0.24 * brx)
    spine_y = bcy + 0.55 * bry
    lung &= ~heart & inner
    lung &= ~ellipse_mask(yy, xx, spine_y, bcx, 0.2 * bry, 0.16 * brx)
    return lung


def generate_series(
    seed: int,
    n_slices: int,
    *,
    slice_thickness_mm: float = 2.5,
    n_nodules: int | None = None,
    size: int | None = 512,
    series_number: int = 1,
) -> list[SliceTruth]:
    """Return a coherent series of ``n_slices`` axial slices through one phantom.

    All slices share the anatomy, the Study/Series/Frame-of-Reference UIDs (in ``SliceTruth.series``) and the
    spacing; ``z_mm`` steps by the slice thickness. Nodules are spheres: each slice shows the cross-section it
    cuts, and is positive iff that cross-section is at least :data:`NODULE_MIN_DIAMETER_MM` wide.

    Args:
        seed: the series seed.
        n_slices: number of slices.
        slice_thickness_mm: slice thickness and spacing between slices.
        n_nodules: number of nodule spheres; None draws 0-3.
        size: matrix size; None draws as :func:`generate_slice` does.
        series_number: DICOM SeriesNumber.
    """
    rng = np.random.default_rng([seed, 7])
    an = sample_anatomy(rng, size)
    info = SeriesInfo(
        seed=seed,
        study_uid=phantom_uid(seed, "study"),
        series_uid=phantom_uid(seed, "series", series_number),
        frame_of_reference_uid=phantom_uid(seed, "for"),
        series_number=series_number,
        slice_thickness_mm=slice_thickness_mm,
    )
    levels = np.linspace(0.55, 1.0, n_slices) if n_slices > 1 else np.array([0.9])
    sp = an.fov_mm / an.size
    coords0 = -(an.size / 2.0 - 0.5) * sp
    if n_nodules is None:
        n_nodules = int(rng.choice([0, 1, 2, 3], p=[0.3, 0.4, 0.2, 0.1]))
    spheres = []
    for _ in range(n_nodules):
        d, hu = nodule_params(rng, NODULE_MIN_DIAMETER_MM + 1.0, 25.0)
        k = int(rng.integers(n_slices))
        centre = sample_nodule(rng, _lung_mask(an, float(levels[k])), coords0, sp, d)
        if centre is not None:
            spheres.append((centre[0], centre[1], k * slice_thickness_mm, d, hu))
    out = []
    for k in range(n_slices):
        z = k * slice_thickness_mm
        visible = []
        for y, x, zc, d, hu in spheres:
            r2 = (d / 2.0) ** 2 - (z - zc) ** 2
            if r2 > 0.25:
                visible.append((y, x, 2.0 * math.sqrt(r2), hu))
        srng = np.random.default_rng([seed, 11, k])
        img, _, drawn = render(an, srng, float(levels[k]), visible)
        shown = [nd for nd in drawn if nd[2] >= NODULE_MIN_DIAMETER_MM]
        out.append(
            SliceTruth(
                hu=img,
                pixel_spacing_mm=(sp, sp),
                has_nodule=bool(shown),
                nodules=shown,
                seed=int(np.random.default_rng([seed, 13, k]).integers(2**31 - 1)),
                z_mm=-300.0 + z,
                slice_thickness_mm=slice_thickness_mm,
                instance_number=k + 1,
                series=info,
                contrast=an.contrast,
                noise_hu=an.noise_hu,
                extra={"fov_mm": an.fov_mm, "level": float(levels[k])},
            )
        )
    return out


# --------------------------------------------------------------------------------------------- storage


def stored_values(truth: SliceTruth, *, signed: bool = False) -> np.ndarray:
    """Return the stored pixel values a DICOM file holds: ``round(hu) + 1024`` clipped to 12 bits.

    Args:
        truth: the slice.
        signed: int16 (PixelRepresentation 1) instead of uint16; the values are the same.
    """
    q = np.clip(np.rint(truth.hu), HU_MIN, HU_MAX) - RESCALE_INTERCEPT
    stored: np.ndarray = q.astype(np.int16 if signed else np.uint16)
    return stored


def modality_values(truth: SliceTruth) -> np.ndarray:
    """Return what a reader recovers after the modality LUT: stored * 1 + (-1024), as float32 HU."""
    return stored_values(truth).astype(np.float32) + np.float32(RESCALE_INTERCEPT)


def model_input(truth: SliceTruth, params: Any) -> np.ndarray:
    """Return the model input for one slice, float32 ``[1, H, W]``, exactly as serving computes it.

    Order: modality values (stored * slope + intercept) -> :func:`window_to_unit` with the model's window ->
    :func:`resize_area` to (H, W). CT is MONOCHROME2, so no inversion.

    Args:
        truth: the slice.
        params: a :class:`appliance.manifest.Manifest`, or a mapping with ``window_center``,
            ``window_width`` and ``size`` = (H, W).
    """
    if isinstance(params, Mapping):
        center, width = float(params["window_center"]), float(params["window_width"])
        h, w = params["size"]
    else:
        pre = params.input.preprocess
        center, width = float(pre["window_center"]), float(pre["window_width"])
        h, w = params.input.shape[2], params.input.shape[3]
    unit = window_to_unit(modality_values(truth), center, width)
    return resize_area(unit, (int(h), int(w)))[None]
