"""Drawing a synthetic chest CT slice in Hounsfield units: anatomy, vessels, nodules, blur and noise.

Pure functions of a numpy random generator; :mod:`.series` decides what to draw and records the truth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Anatomy", "blur", "ellipse_mask", "nodule_params", "render", "sample_anatomy", "sample_nodule"]


# --------------------------------------------------------------------------------------------- drawing


def blur(a: np.ndarray) -> np.ndarray:
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


def smooth_noise(rng: np.random.Generator, shape: tuple[int, int], cell: int) -> np.ndarray:
    """Low-frequency noise with unit-ish amplitude: coarse Gaussian grid, bilinear upsampling."""
    from PIL import Image

    gh, gw = max(2, shape[0] // cell), max(2, shape[1] // cell)
    coarse = rng.standard_normal((gh, gw)).astype(np.float32)
    img = Image.fromarray(coarse).resize((shape[1], shape[0]), Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.float32)


def ellipse_mask(yy: np.ndarray, xx: np.ndarray, cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
    """Return the boolean mask of the ellipse centred (cy, cx) with radii (ry, rx) on the grid (yy, xx)."""
    return ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0


def paint_blob(
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
    r: np.floating[Any] | np.ndarray = np.float32(radius_px)
    if lobes[0] > 0.0:
        theta = np.arctan2(v, u)
        r = r * (1.0 + lobes[0] * np.sin(lobes[1] * theta + lobes[2]))
    alpha = np.clip(r - dist + 0.5, 0.0, 1.0)
    if within is not None:
        alpha = alpha * within[r0:r1, c0:c1]
    patch = img[r0:r1, c0:c1]
    patch += alpha * (np.float32(value) - patch)


def paint_capsule(
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
class Anatomy:
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


def sample_anatomy(rng: np.random.Generator, size: int | None) -> Anatomy:
    """Draw the patient-level parameters of one phantom (size, field of view, body, dose, contrast)."""
    if size is None:
        size = int(rng.choice([512, 256, 384, 640, 768], p=[0.85, 0.04, 0.04, 0.03, 0.04]))
    fov = float(rng.uniform(300.0, 450.0))
    rx = float(rng.uniform(125.0, 185.0))
    ry = rx * float(rng.uniform(0.62, 0.80))
    body = (float(rng.uniform(-10.0, 25.0)), float(rng.uniform(-15.0, 15.0)), ry, rx)
    return Anatomy(
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


def render(
    an: Anatomy, rng: np.random.Generator, level: float, nodules_mm: Sequence[tuple[float, float, float, float]]
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
    body = ellipse_mask(yy, xx, bcy, bcx, bry, brx)
    img[body] = -95.0
    inner = ellipse_mask(yy, xx, bcy, bcx, bry - an.fat_mm, brx - an.fat_mm)
    img[inner] = an.soft_hu
    for k in range(14):
        t = math.pi * (0.12 + 0.76 * (k % 7) / 6.0)
        side = -1.0 if k < 7 else 1.0
        ry_, rx_ = bry - an.fat_mm - 8.0, brx - an.fat_mm - 8.0
        ry_c = bcy - ry_ * math.cos(t) * 0.95
        rx_c = bcx + side * rx_ * math.sin(t)
        paint_blob(img, (ry_c - coords[0]) / sp, (rx_c - coords[0]) / sp, 5.0 / sp, float(rng.uniform(450, 850)),
                    aspect=0.55, angle=float(t))
    spine_y = bcy + 0.55 * bry
    paint_blob(img, (spine_y - coords[0]) / sp, (bcx - coords[0]) / sp, 17.0 / sp, 750.0)
    paint_blob(img, (spine_y - coords[0]) / sp, (bcx - coords[0]) / sp, 14.0 / sp, 280.0)

    # Lungs: two ellipses, narrowed medially by the heart, denser posteriorly (dependent atelectasis).
    lung = np.zeros((n, n), dtype=bool)
    lry, lrx = an.lung_r[0] * bry * level, an.lung_r[1] * brx * math.sqrt(level)
    lcy = bcy + an.lung_y * bry
    for side in (-1.0, 1.0):
        lung |= ellipse_mask(yy, xx, lcy, bcx + side * an.lung_x * brx, lry, lrx)
    heart_ry, heart_rx = 0.42 * bry * level, 0.24 * brx
    heart = ellipse_mask(yy, xx, bcy - 0.12 * bry, bcx + 0.06 * brx, heart_ry, heart_rx)
    lung &= ~heart & inner
    lung &= ~ellipse_mask(yy, xx, spine_y, bcx, 0.2 * bry, 0.16 * brx)
    texture = smooth_noise(rng, (n, n), max(4, int(12.0 / sp)))
    gradient = np.clip((yy - lcy) / max(lry, 1.0), -1.0, 1.0) * 35.0 + 35.0
    lung_img = an.lung_hu + 18.0 * texture + gradient
    img = np.where(lung, lung_img, img).astype(np.float32)

    blood = float(rng.uniform(160.0, 280.0)) if an.contrast else 42.0
    if level > 0.25:
        aorta_y, aorta_x = spine_y - 0.22 * bry, bcx + 0.12 * brx
        paint_blob(img, (aorta_y - coords[0]) / sp, (aorta_x - coords[0]) / sp, 13.0 / sp, blood)

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
                paint_capsule(img, p, q, width / sp, blood * float(rng.uniform(0.8, 1.0)), within=lung_f)
        for _ in range(int(rng.integers(25, 90))):
            i = int(rng.integers(ly.size))
            d_mm = float(rng.uniform(0.8, 3.0))
            if rng.random() < 0.5:  # obliquely cut vessel: a short ellipse
                paint_blob(img, float(ly[i]), float(lx[i]), d_mm / 2 / sp, blood * float(rng.uniform(0.7, 1.0)),
                            aspect=float(rng.uniform(0.3, 0.7)), angle=float(rng.uniform(0, math.pi)),
                            within=lung_f)
            else:
                paint_blob(img, float(ly[i]), float(lx[i]), d_mm / 2 / sp, blood * float(rng.uniform(0.7, 1.0)),
                            within=lung_f)

    # Nodules.
    drawn = []
    for y_mm, x_mm, d_mm, hu in nodules_mm:
        r, c = (y_mm - coords[0]) / sp, (x_mm - coords[0]) / sp
        paint_blob(
            img, r, c, d_mm / 2.0 / sp, hu,
            aspect=float(rng.uniform(0.8, 1.0)), angle=float(rng.uniform(0, math.pi)),
            lobes=(float(rng.uniform(0.0, 0.12)), int(rng.integers(3, 7)), float(rng.uniform(0, 6.3))),
        )
        drawn.append((float(r), float(c), float(d_mm), float(hu)))

    # Point spread, then correlated quantum noise (a little stronger inside the body).
    img = blur(img)
    noise = blur(rng.standard_normal((n, n), dtype=np.float32))
    noise *= np.float32(an.noise_hu / 0.375)
    noise[~body] *= np.float32(0.5)
    img += noise
    return img, lung, drawn


def sample_nodule(
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


def nodule_params(rng: np.random.Generator, min_mm: float, max_mm: float) -> tuple[float, float]:
    """(diameter mm log-uniform in [min, max], core HU).

    Solid nodules are -50..100 HU; a quarter of the nodules of 6 mm or more are sub-solid (-500..-250 HU).
    """
    d = float(math.exp(rng.uniform(math.log(min_mm), math.log(max_mm))))
    subsolid = rng.random() < 0.25
    hu = float(rng.uniform(-500.0, -250.0)) if subsolid and d >= 6.0 else float(rng.uniform(-50.0, 100.0))
    return d, hu
