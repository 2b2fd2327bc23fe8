"""Synthetic chest CT: deterministic phantom slices and series with ground truth, as real DICOM.

The project cannot download patient data or public datasets, so it generates its own. One generator feeds
model training, the tests and ``appliance bench``:

* :func:`generate_slice` draws one axial chest slice in Hounsfield units: air, a body outline with a fat
  layer, ribs, spine, heart and aorta, two lungs at about -850 HU with a dependent density gradient and
  texture, pulmonary vessels (round cross-sections up to 3 mm and elongated branches, some wider near the
  hilum) as distractors, and 0-3 nodules of 4-30 mm (solid or sub-solid, slightly lobulated). A blur models
  the scanner's point spread and correlated Gaussian noise models quantum noise. The field of view (300-450
  mm), matrix size (512 typical, sometimes 256/384/640/768), dose and contrast vary.
* :func:`generate_series` draws a coherent stack: one anatomy, nodules as spheres cut by each slice.
* :func:`to_dicom` writes a CT Image Storage Part-10 file in any of :data:`TRANSFER_SYNTAXES`.
* :func:`model_input` applies exactly what the serving pipeline applies (stored values -> modality LUT ->
  model window -> area resize), so training sees bit-for-bit what serving sees.
* :func:`workload` produces named mixes of DICOM bytes for benchmarks.

Everything is a pure function of the seed. Patients are phantoms (``PHANTOM^0001``); nothing here is, or is
derived from, patient data.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import (
    CTImageStorage,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGLSLossless,
    JPEGLSNearLossless,
    RLELossless,
    generate_uid,
)

from appliance.preprocess import resize_area, window_to_unit

__all__ = [
    "NODULE_MIN_DIAMETER_MM",
    "TRANSFER_SYNTAXES",
    "WORKLOADS",
    "SeriesInfo",
    "SliceTruth",
    "generate_series",
    "generate_slice",
    "model_input",
    "modality_values",
    "read_back",
    "stored_values",
    "to_dicom",
    "workload",
]

NODULE_MIN_DIAMETER_MM = 4.0  # a slice is positive iff it shows a nodule at least this wide
HU_MIN, HU_MAX = -1024.0, 3071.0  # representable with RescaleIntercept -1024 and 12 bits stored
RESCALE_INTERCEPT = -1024.0

# Transfer syntax UID -> pixel encoding plugin for ds.compress ("" = native, written by pydicom itself).
TRANSFER_SYNTAXES: dict[str, str] = {
    ExplicitVRLittleEndian: "",
    ImplicitVRLittleEndian: "",
    DeflatedExplicitVRLittleEndian: "",
    ExplicitVRBigEndian: "",
    RLELossless: "pylibjpeg",
    JPEGLSLossless: "pyjpegls",
    JPEGLSNearLossless: "pyjpegls",
    JPEG2000Lossless: "pylibjpeg",
}

# Named workload mixes for ``appliance bench``: transfer syntax UID -> relative weight.
WORKLOADS: dict[str, dict[str, float]] = {
    # What a PACS typically sends a CT box: mostly uncompressed, then lossless compressions.
    "mixed": {
        ExplicitVRLittleEndian: 0.40,
        ImplicitVRLittleEndian: 0.10,
        RLELossless: 0.15,
        JPEGLSLossless: 0.15,
        JPEG2000Lossless: 0.15,
        DeflatedExplicitVRLittleEndian: 0.05,
    },
    "native": {ExplicitVRLittleEndian: 0.8, ImplicitVRLittleEndian: 0.2},
    "j2k": {JPEG2000Lossless: 1.0},
    "jpegls": {JPEGLSLossless: 0.7, JPEGLSNearLossless: 0.3},
    "rle": {RLELossless: 1.0},
    # The held-out peer-comparison mix (docs/performance.md): a quarter each of uncompressed, RLE, JPEG-LS and
    # JPEG 2000, all lossless.
    "quarters": {ExplicitVRLittleEndian: 0.25, RLELossless: 0.25, JPEGLSLossless: 0.25, JPEG2000Lossless: 0.25},
}

_UID_ROOT = "1.2.826.0.1.3680043.8.498."  # pydicom's root, as generate_uid uses by default


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


# --------------------------------------------------------------------------------------------- drawing


def _blur(a: np.ndarray) -> np.ndarray:
    """Separable [1, 2, 1] / 4 blur, edges replicated, in place-ish (returns a new array)."""
    b = np.empty_like(a)
    b[1:-1] = a[:-2] + a[2:] + 2.0 * a[1:-1]
    b[0] = 3.0 * a[0] + a[1]
    b[-1] = 3.0 * a[-1] + a[-2]
    c = np.empty_like(a)
    c[:, 1:-1] = b[:, :-2] + b[:, 2:] + 2.0 * b[:, 1:-1]
    c[:, 0] = 3.0 * b[:, 0] + b[:, 1]
    c[:, -1] = 3.0 * b[:, -1] + b[:, -2]
    c *= np.float32(1.0 / 16.0)
    return c


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], cell: int) -> np.ndarray:
    """Low-frequency noise with unit-ish amplitude: coarse Gaussian grid, bilinear upsampling."""
    from PIL import Image

    gh, gw = max(2, shape[0] // cell), max(2, shape[1] // cell)
    coarse = rng.standard_normal((gh, gw)).astype(np.float32)
    img = Image.fromarray(coarse).resize((shape[1], shape[0]), Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.float32)


def _ellipse_mask(yy: np.ndarray, xx: np.ndarray, cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
    return ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0


def _paint_blob(
    img: np.ndarray,
    cy: float,
    cx: float,
    radius_px: float,
    value: float,
    *,
    aspect: float = 1.0,
    angle: float = 0.0,
    lobes: tuple[float, int, float] = (0.0, 0, 0.0),
    within: np.ndarray | None = None,
) -> None:
    """Blend an anti-aliased (lobulated) ellipse of ``value`` into ``img`` in place, in a local box."""
    rows, cols = img.shape
    reach = radius_px * (1.0 + lobes[0]) / min(aspect, 1.0) + 2.0
    r0, r1 = max(0, int(cy - reach)), min(rows, int(cy + reach) + 2)
    c0, c1 = max(0, int(cx - reach)), min(cols, int(cx + reach) + 2)
    if r0 >= r1 or c0 >= c1:
        return
    y = np.arange(r0, r1, dtype=np.float32)[:, None] - np.float32(cy)
    x = np.arange(c0, c1, dtype=np.float32)[None, :] - np.float32(cx)
    ca, sa = math.cos(angle), math.sin(angle)
    u = x * ca + y * sa
    v = (-x * sa + y * ca) / aspect
    dist = np.sqrt(u * u + v * v)
    r = np.float32(radius_px)
    if lobes[0] > 0.0:
        theta = np.arctan2(v, u)
        r = r * (1.0 + lobes[0] * np.sin(lobes[1] * theta + lobes[2]))
    alpha = np.clip(r - dist + 0.5, 0.0, 1.0)
    if within is not None:
        alpha = alpha * within[r0:r1, c0:c1]
    patch = img[r0:r1, c0:c1]
    patch += alpha * (np.float32(value) - patch)


def _paint_capsule(
    img: np.ndarray, p: tuple[float, float], q: tuple[float, float], width_px: float, value: float,
    within: np.ndarray | None = None,
) -> None:
    """Blend an anti-aliased line segment (a vessel running in-plane) into ``img`` in place."""
    rows, cols = img.shape
    half = width_px / 2.0
    r0 = max(0, int(min(p[0], q[0]) - half - 2))
    r1 = min(rows, int(max(p[0], q[0]) + half + 3))
    c0 = max(0, int(min(p[1], q[1]) - half - 2))
    c1 = min(cols, int(max(p[1], q[1]) + half + 3))
    if r0 >= r1 or c0 >= c1:
        return
    y = np.arange(r0, r1, dtype=np.float32)[:, None]
    x = np.arange(c0, c1, dtype=np.float32)[None, :]
    dy, dx = q[0] - p[0], q[1] - p[1]
    ll = dy * dy + dx * dx or 1e-6
    t = np.clip(((y - p[0]) * dy + (x - p[1]) * dx) / ll, 0.0, 1.0)
    d = np.sqrt((y - p[0] - t * dy) ** 2 + (x - p[1] - t * dx) ** 2)
    alpha = np.clip(np.float32(half) - d + 0.5, 0.0, 1.0)
    if within is not None:
        alpha = alpha * within[r0:r1, c0:c1]
    patch = img[r0:r1, c0:c1]
    patch += alpha * (np.float32(value) - patch)


# --------------------------------------------------------------------------------------------- anatomy


@dataclass
class _Anatomy:
    """Per-patient geometry (mm, relative to the image centre) and acquisition parameters."""

    size: int
    fov_mm: float
    body: tuple[float, float, float, float]  # cy, cx, ry, rx
    fat_mm: float
    lung_hu: float
    lung_y: float  # lung centre y offset (fraction of body ry)
    lung_x: float  # lung centre x (fraction of body rx)
    lung_r: tuple[float, float]  # (ry, rx) as fractions of body (ry, rx)
    contrast: bool
    noise_hu: float
    soft_hu: float


def _sample_anatomy(rng: np.random.Generator, size: int | None) -> _Anatomy:
    if size is None:
        size = int(rng.choice([512, 256, 384, 640, 768], p=[0.85, 0.04, 0.04, 0.03, 0.04]))
    fov = float(rng.uniform(300.0, 450.0))
    rx = float(rng.uniform(125.0, 185.0))
    ry = rx * float(rng.uniform(0.62, 0.80))
    body = (float(rng.uniform(-10.0, 25.0)), float(rng.uniform(-15.0, 15.0)), ry, rx)
    return _Anatomy(
        size=size,
        fov_mm=fov,
        body=body,
        fat_mm=float(rng.uniform(4.0, 25.0)),
        lung_hu=float(rng.uniform(-890.0, -810.0)),
        lung_y=float(rng.uniform(-0.12, 0.02)),
        lung_x=float(rng.uniform(0.42, 0.50)),
        lung_r=(float(rng.uniform(0.62, 0.78)), float(rng.uniform(0.33, 0.40))),
        contrast=bool(rng.random() < 0.4),
        noise_hu=float(rng.uniform(8.0, 30.0)),
        soft_hu=float(rng.uniform(30.0, 55.0)),
    )


def _render(
    an: _Anatomy, rng: np.random.Generator, level: float, nodules_mm: Sequence[tuple[float, float, float, float]]
) -> tuple[np.ndarray, np.ndarray, list[tuple[float, float, float, float]]]:
    """Render one slice.

    Args:
        an: the anatomy.
        rng: random source for this slice's vessels, texture and noise.
        level: lung extent in (0, 1]: small near the apex, 1 at mid-thorax.
        nodules_mm: (y_mm, x_mm, visible diameter mm, hu) to draw; coordinates relative to the image centre.

    Returns:
        (hu image, lung mask, nodules in pixel coordinates (row, col, diameter_mm, hu)).
    """
    n = an.size
    sp = an.fov_mm / n
    coords = (np.arange(n, dtype=np.float32) - (n / 2.0 - 0.5)) * np.float32(sp)
    yy, xx = coords[:, None], coords[None, :]
    bcy, bcx, bry, brx = an.body
    img = np.full((n, n), -1000.0, dtype=np.float32)

    # Table under the patient, body with a subcutaneous fat layer, ribs, spine.
    table_y = bcy + bry + 8.0
    img[(yy >= table_y) & (yy <= table_y + 10.0) & (np.abs(xx - bcx) < 0.45 * an.fov_mm)] = 150.0
    body = _ellipse_mask(yy, xx, bcy, bcx, bry, brx)
    img[body] = -95.0
    inner = _ellipse_mask(yy, xx, bcy, bcx, bry - an.fat_mm, brx - an.fat_mm)
    img[inner] = an.soft_hu
    for k in range(14):
        t = math.pi * (0.12 + 0.76 * (k % 7) / 6.0)
        side = -1.0 if k < 7 else 1.0
        ry_, rx_ = bry - an.fat_mm - 8.0, brx - an.fat_mm - 8.0
        ry_c = bcy - ry_ * math.cos(t) * 0.95
        rx_c = bcx + side * rx_ * math.sin(t)
        _paint_blob(img, (ry_c - coords[0]) / sp, (rx_c - coords[0]) / sp, 5.0 / sp, float(rng.uniform(450, 850)),
                    aspect=0.55, angle=float(t))
    spine_y = bcy + 0.55 * bry
    _paint_blob(img, (spine_y - coords[0]) / sp, (bcx - coords[0]) / sp, 17.0 / sp, 750.0)
    _paint_blob(img, (spine_y - coords[0]) / sp, (bcx - coords[0]) / sp, 14.0 / sp, 280.0)

    # Lungs: two ellipses, narrowed medially by the heart, denser posteriorly (dependent atelectasis).
    lung = np.zeros((n, n), dtype=bool)
    lry, lrx = an.lung_r[0] * bry * level, an.lung_r[1] * brx * math.sqrt(level)
    lcy = bcy + an.lung_y * bry
    for side in (-1.0, 1.0):
        lung |= _ellipse_mask(yy, xx, lcy, bcx + side * an.lung_x * brx, lry, lrx)
    heart_ry, heart_rx = 0.42 * bry * level, 0.24 * brx
    heart = _ellipse_mask(yy, xx, bcy - 0.12 * bry, bcx + 0.06 * brx, heart_ry, heart_rx)
    lung &= ~heart & inner
    lung &= ~_ellipse_mask(yy, xx, spine_y, bcx, 0.2 * bry, 0.16 * brx)
    texture = _smooth_noise(rng, (n, n), max(4, int(12.0 / sp)))
    gradient = np.clip((yy - lcy) / max(lry, 1.0), -1.0, 1.0) * 35.0 + 35.0
    lung_img = an.lung_hu + 18.0 * texture + gradient
    img = np.where(lung, lung_img, img).astype(np.float32)

    blood = float(rng.uniform(160.0, 280.0)) if an.contrast else 42.0
    if level > 0.25:
        aorta_y, aorta_x = spine_y - 0.22 * bry, bcx + 0.12 * brx
        _paint_blob(img, (aorta_y - coords[0]) / sp, (aorta_x - coords[0]) / sp, 13.0 / sp, blood)

    # Pulmonary vessels: branches radiating from each hilum, and small round cross-sections.
    lung_f = lung.astype(np.float32)
    ly, lx = np.nonzero(lung)
    if ly.size:
        for side in (-1.0, 1.0):
            hy = (lcy + 0.05 * bry - coords[0]) / sp
            hx = (bcx + side * (an.lung_x * brx - 0.55 * an.lung_r[1] * brx) - coords[0]) / sp
            for _ in range(int(rng.integers(6, 14))):
                ang = float(rng.uniform(-math.pi, math.pi))
                start = float(rng.uniform(0.0, 25.0)) / sp
                length = float(rng.uniform(15.0, 70.0)) / sp
                width = float(rng.uniform(1.5, 6.0)) * (1.0 - 0.5 * start * sp / 25.0)
                p = (hy + start * math.sin(ang), hx + side * start * math.cos(ang))
                q = (p[0] + length * math.sin(ang), p[1] + side * length * math.cos(ang))
                _paint_capsule(img, p, q, width / sp, blood * float(rng.uniform(0.8, 1.0)), within=lung_f)
        for _ in range(int(rng.integers(25, 90))):
            i = int(rng.integers(ly.size))
            d_mm = float(rng.uniform(0.8, 3.0))
            if rng.random() < 0.5:  # obliquely cut vessel: a short ellipse
                _paint_blob(img, float(ly[i]), float(lx[i]), d_mm / 2 / sp, blood * float(rng.uniform(0.7, 1.0)),
                            aspect=float(rng.uniform(0.3, 0.7)), angle=float(rng.uniform(0, math.pi)),
                            within=lung_f)
            else:
                _paint_blob(img, float(ly[i]), float(lx[i]), d_mm / 2 / sp, blood * float(rng.uniform(0.7, 1.0)),
                            within=lung_f)

    # Nodules.
    drawn = []
    for y_mm, x_mm, d_mm, hu in nodules_mm:
        r, c = (y_mm - coords[0]) / sp, (x_mm - coords[0]) / sp
        _paint_blob(
            img, r, c, d_mm / 2.0 / sp, hu,
            aspect=float(rng.uniform(0.8, 1.0)), angle=float(rng.uniform(0, math.pi)),
            lobes=(float(rng.uniform(0.0, 0.12)), int(rng.integers(3, 7)), float(rng.uniform(0, 6.3))),
        )
        drawn.append((float(r), float(c), float(d_mm), float(hu)))

    # Point spread, then correlated quantum noise (a little stronger inside the body).
    img = _blur(img)
    noise = _blur(rng.standard_normal((n, n), dtype=np.float32))
    noise *= np.float32(an.noise_hu / 0.375)
    noise[~body] *= np.float32(0.5)
    img += noise
    return img, lung, drawn


def _sample_nodule(
    rng: np.random.Generator, lung: np.ndarray, coords0: float, sp: float, d_mm: float
) -> tuple[float, float] | None:
    """Pick a nodule centre (mm) whose disc fits inside the lung mask, or None after 40 tries."""
    ly, lx = np.nonzero(lung)
    if ly.size == 0:
        return None
    r_px = d_mm / 2.0 / sp
    rows, cols = lung.shape
    for _ in range(40):
        i = int(rng.integers(ly.size))
        cy, cx = float(ly[i]), float(lx[i])
        ok = True
        for a in range(8):
            py = int(round(cy + r_px * math.sin(a * math.pi / 4)))
            px = int(round(cx + r_px * math.cos(a * math.pi / 4)))
            if not (0 <= py < rows and 0 <= px < cols and lung[py, px]):
                ok = False
                break
        if ok:
            return cy * sp + coords0, cx * sp + coords0
    return None


def _nodule_params(rng: np.random.Generator, min_mm: float, max_mm: float) -> tuple[float, float]:
    """(diameter mm log-uniform in [min, max], core HU).

    Solid nodules are -50..100 HU; a quarter of the nodules of 6 mm or more are sub-solid (-500..-250 HU).
    """
    d = float(math.exp(rng.uniform(math.log(min_mm), math.log(max_mm))))
    subsolid = rng.random() < 0.25
    hu = float(rng.uniform(-500.0, -250.0)) if subsolid and d >= 6.0 else float(rng.uniform(-50.0, 100.0))
    return d, hu


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
    an = _sample_anatomy(rng, size)
    level = float(rng.uniform(0.45, 1.0))
    positive = bool(rng.random() < p_nodule) if nodule is None else bool(nodule)
    n_nod = int(rng.choice([1, 2, 3], p=[0.7, 0.2, 0.1])) if positive else 0
    # Nodule positions need the lung mask: render a throw-away mask first via a cheap geometric pass.
    sp = an.fov_mm / an.size
    coords0 = -(an.size / 2.0 - 0.5) * sp
    lung = _lung_mask(an, level)
    nods: list[tuple[float, float, float, float]] = []
    for _ in range(n_nod):
        d, hu = _nodule_params(rng, min_diameter_mm, max_diameter_mm)
        centre = _sample_nodule(rng, lung, coords0, sp, d)
        if centre is None:
            d = min_diameter_mm
            centre = _sample_nodule(rng, lung, coords0, sp, d)
        if centre is not None:
            nods.append((centre[0], centre[1], d, hu))
    img, _, drawn = _render(an, rng, level, nods)
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


def _lung_mask(an: _Anatomy, level: float) -> np.ndarray:
    """The lung mask exactly as :func:`_render` computes it (without drawing)."""
    n = an.size
    sp = an.fov_mm / n
    coords = (np.arange(n, dtype=np.float32) - (n / 2.0 - 0.5)) * np.float32(sp)
    yy, xx = coords[:, None], coords[None, :]
    bcy, bcx, bry, brx = an.body
    inner = _ellipse_mask(yy, xx, bcy, bcx, bry - an.fat_mm, brx - an.fat_mm)
    lung = np.zeros((n, n), dtype=bool)
    lry, lrx = an.lung_r[0] * bry * level, an.lung_r[1] * brx * math.sqrt(level)
    lcy = bcy + an.lung_y * bry
    for side in (-1.0, 1.0):
        lung |= _ellipse_mask(yy, xx, lcy, bcx + side * an.lung_x * brx, lry, lrx)
    heart = _ellipse_mask(yy, xx, bcy - 0.12 * bry, bcx + 0.06 * brx, 0.42 * bry * level, 0.24 * brx)
    spine_y = bcy + 0.55 * bry
    lung &= ~heart & inner
    lung &= ~_ellipse_mask(yy, xx, spine_y, bcx, 0.2 * bry, 0.16 * brx)
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
    an = _sample_anatomy(rng, size)
    info = SeriesInfo(
        seed=seed,
        study_uid=_uid(seed, "study"),
        series_uid=_uid(seed, "series", series_number),
        frame_of_reference_uid=_uid(seed, "for"),
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
        d, hu = _nodule_params(rng, NODULE_MIN_DIAMETER_MM + 1.0, 25.0)
        k = int(rng.integers(n_slices))
        centre = _sample_nodule(rng, _lung_mask(an, float(levels[k])), coords0, sp, d)
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
        img, _, drawn = _render(an, srng, float(levels[k]), visible)
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
    return q.astype(np.int16 if signed else np.uint16)


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


def _uid(seed: int, *parts: object) -> str:
    return generate_uid(prefix=_UID_ROOT, entropy_srcs=["edge-appliance-phantom", str(seed), *map(str, parts)])


def _base_dataset(
    truth: SliceTruth, patient_index: int, series: SeriesInfo | None, instance_number: int | None, signed: bool
) -> Dataset:
    series = series or truth.series
    seed = truth.seed
    study_uid = series.study_uid if series else _uid(seed, "study")
    series_uid = series.series_uid if series else _uid(seed, "series", 1)
    for_uid = series.frame_of_reference_uid if series else _uid(seed, "for")
    number = instance_number if instance_number is not None else truth.instance_number
    rows, cols = truth.shape
    ds = Dataset()
    ds.SOPClassUID = CTImageStorage
    ds.SOPInstanceUID = _uid(seed, "instance", number, series_uid)
    ds.StudyInstanceUID = study_uid
    ds.SeriesInstanceUID = series_uid
    ds.FrameOfReferenceUID = for_uid
    ds.Modality = "CT"
    ds.Manufacturer = "edge-appliance synthetic"
    ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
    ds.PatientName = f"PHANTOM^{patient_index:04d}"
    ds.PatientID = f"PHANTOM-{patient_index:04d}"
    ds.PatientBirthDate = ""
    ds.PatientSex = "O"
    ds.StudyDate = "20240101"
    ds.StudyTime = "120000"
    ds.AccessionNumber = ""
    ds.ReferringPhysicianName = ""
    ds.StudyID = "1"
    ds.SeriesNumber = series.series_number if series else 1
    ds.InstanceNumber = number
    ds.BodyPartExamined = "CHEST"
    ds.KVP = "120"
    ds.SliceThickness = f"{(series.slice_thickness_mm if series else truth.slice_thickness_mm):.2f}"
    ds.PixelSpacing = [f"{truth.pixel_spacing_mm[0]:.6f}", f"{truth.pixel_spacing_mm[1]:.6f}"]
    x0 = -(cols / 2.0 - 0.5) * truth.pixel_spacing_mm[1]
    y0 = -(rows / 2.0 - 0.5) * truth.pixel_spacing_mm[0]
    ds.ImagePositionPatient = [f"{x0:.4f}", f"{y0:.4f}", f"{truth.z_mm:.4f}"]
    ds.ImageOrientationPatient = ["1", "0", "0", "0", "1", "0"]
    ds.SliceLocation = f"{truth.z_mm:.4f}"
    ds.PatientPosition = "HFS"
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows, ds.Columns = rows, cols
    ds.BitsAllocated = 16
    ds.BitsStored = 16 if signed else 12
    ds.HighBit = ds.BitsStored - 1
    ds.PixelRepresentation = 1 if signed else 0
    ds.RescaleIntercept = str(int(RESCALE_INTERCEPT))
    ds.RescaleSlope = "1"
    ds.RescaleType = "HU"
    ds.WindowCenter = ["-600", "40"]
    ds.WindowWidth = ["1500", "400"]
    ds.WindowCenterWidthExplanation = ["LUNG", "MEDIASTINUM"]
    ds.PixelData = stored_values(truth, signed=signed).tobytes()
    ds["PixelData"].VR = "OW"
    return ds


def _encode(ds: Dataset, transfer_syntax: str) -> Dataset:
    """Set the file meta and compress in place for ``transfer_syntax``; returns ``ds``."""
    if transfer_syntax not in TRANSFER_SYNTAXES:
        raise ValueError(f"unsupported transfer syntax {transfer_syntax}; have {sorted(TRANSFER_SYNTAXES)}")
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = ds.SOPClassUID
    meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    meta.ImplementationClassUID = _UID_ROOT + "1"
    meta.ImplementationVersionName = "EDGEAPPL_SYN"
    ds.file_meta = meta
    plugin = TRANSFER_SYNTAXES[transfer_syntax]
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    if plugin:
        kwargs: dict[str, Any] = {"encoding_plugin": plugin}
        if transfer_syntax == JPEGLSNearLossless:
            kwargs["jls_error"] = 2
        ds.compress(transfer_syntax, **kwargs)
    else:
        if transfer_syntax == ExplicitVRBigEndian:
            arr = np.frombuffer(ds.PixelData, dtype=np.int16 if ds.PixelRepresentation else np.uint16)
            ds.PixelData = arr.byteswap().tobytes()
        meta.TransferSyntaxUID = transfer_syntax
    return ds


def _write(ds: Dataset) -> bytes:
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def to_dicom(
    truth: SliceTruth,
    *,
    transfer_syntax: str = ExplicitVRLittleEndian,
    patient_index: int = 1,
    series: SeriesInfo | None = None,
    instance_number: int | None = None,
    signed: bool = False,
) -> bytes:
    """Return ``truth`` as a Part-10 CT Image Storage file (bytes).

    The file carries RescaleIntercept -1024 / slope 1, lung and mediastinal window presets, pixel spacing,
    slice thickness, position/orientation, a phantom patient and deterministic UIDs derived from the seed.

    Args:
        truth: the slice.
        transfer_syntax: one of :data:`TRANSFER_SYNTAXES` (native, deflated, big endian, RLE, JPEG-LS
            lossless/near-lossless (NEAR=2), JPEG 2000 lossless).
        patient_index: phantom number: ``PHANTOM^0001``, ``PHANTOM-0001``.
        series: series identity (default: the slice's own, or one derived from its seed).
        instance_number: InstanceNumber (default: the slice's).
        signed: store int16 with BitsStored 16 (PixelRepresentation 1) instead of uint16 with BitsStored 12.
    """
    ds = _base_dataset(truth, patient_index, series, instance_number, signed)
    return _write(_encode(ds, transfer_syntax))


def _apportion(weights: np.ndarray, n: int) -> np.ndarray:
    """Syntax index per file: exactly round(n * share) files of each (largest remainder), in index order."""
    quota = weights / weights.sum() * n
    counts = np.floor(quota).astype(int)
    for k in np.argsort(-(quota - counts), kind="stable")[: n - int(counts.sum())]:
        counts[k] += 1
    return np.repeat(np.arange(len(weights)), counts)


def workload(name: str, n: int, seed: int) -> list[bytes]:
    """Return ``n`` DICOM files (bytes) in the named transfer-syntax mix of :data:`WORKLOADS`.

    The mix is exact (largest-remainder counts, shuffled by the seed), so two runs of a benchmark never differ
    by a sampled composition. A handful of base slices is generated and each (slice, syntax) pair is encoded
    once; every returned file still has its own SOPInstanceUID and InstanceNumber.

    Args:
        name: a key of :data:`WORKLOADS`.
        n: number of files.
        seed: the seed; the result is a pure function of (name, n, seed).
    """
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; have {sorted(WORKLOADS)}")
    mix = WORKLOADS[name]
    rng = np.random.default_rng([seed, 17])
    syntaxes = list(mix)
    weights = np.asarray([mix[s] for s in syntaxes], dtype=np.float64)
    chosen = rng.permutation(_apportion(weights, n))
    n_base = min(n, 8)
    bases = [generate_slice(np.random.default_rng([seed, 19, i]).integers(2**31 - 1), size=512) for i in
             range(n_base)]
    cache: dict[tuple[int, str], Dataset] = {}
    out = []
    for i in range(n):
        b, ts = i % n_base, syntaxes[int(chosen[i])]
        if (b, ts) not in cache:
            ds = _base_dataset(bases[b], 1 + b, None, 1, signed=False)
            cache[(b, ts)] = _encode(ds, ts)
        ds = cache[(b, ts)]
        ds.InstanceNumber = i + 1
        ds.SOPInstanceUID = _uid(seed, name, "instance", i)
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        out.append(_write(ds))
    return out


def read_back(data: bytes) -> np.ndarray:
    """Decode a generated file's pixels to modality values (float32 HU). Test helper, not the serving path."""
    ds = pydicom.dcmread(io.BytesIO(data))
    arr = ds.pixel_array.astype(np.float32)
    return arr * np.float32(float(ds.RescaleSlope)) + np.float32(float(ds.RescaleIntercept))
