"""Pre-generated slice pools: model inputs, labels and per-patch targets, computed once per seed.

Generating a slice costs more than a training step on it, so training draws from a pool generated up front.
Every input goes through :func:`appliance.tools.synthetic.model_input`, i.e. the serving pipeline's own kernels.

Slice ``i`` of the pool for ``seed`` is ``generate_slice(np.random.default_rng([seed, i]))``: a pool is a pure
function of (seed, n, params), and pools of different seeds share no slice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from appliance.tools import synthetic

__all__ = ["InputParams", "Pool", "cells_hit", "curriculum_weights", "generate_pool"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputParams:
    """The input contract the pool is generated for (mirrors ``[input.preprocess]``)."""

    size: int = 256  # model input H = W
    window_center: float = -600.0  # HU
    window_width: float = 1500.0  # HU
    stride: int = 16  # heatmap cell size in model-input pixels

    @property
    def grid(self) -> int:
        """Heatmap cells per side."""
        return self.size // self.stride

    def as_mapping(self) -> dict[str, object]:
        """The mapping :func:`appliance.tools.synthetic.model_input` takes."""
        return {"window_center": self.window_center, "window_width": self.window_width,
                "size": (self.size, self.size)}


@dataclass(repr=False)
class Pool:
    """A generated set of model inputs with ground truth."""

    x: np.ndarray  # float16 [N, 1, H, W], model inputs
    label: np.ndarray  # uint8 [N], 1 = nodule >= 4 mm in the slice
    target: np.ndarray  # uint8 [N, g, g], 1 = cell overlaps a nodule
    max_diameter_mm: np.ndarray  # float32 [N], largest nodule diameter (0 for negatives)
    nodules: list[np.ndarray]  # per slice float32 [k, 3]: (row, col, radius) in model-input pixels
    params: InputParams

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def __repr__(self) -> str:
        return f"Pool(n={len(self)}, positives={int(self.label.sum())}, size={self.params.size})"


def cells_hit(nodules: np.ndarray, grid: int, stride: int) -> np.ndarray:
    """Return a bool [grid, grid] map of the cells whose square overlaps any nodule disc.

    Args:
        nodules: float [k, 3] (row, col, radius) in model-input pixels.
        grid: cells per side.
        stride: cell size in model-input pixels.
    """
    out = np.zeros((grid, grid), dtype=bool)
    if len(nodules) == 0:
        return out
    lo = np.arange(grid, dtype=np.float32) * stride
    hi = lo + stride
    for r, c, rad in nodules:
        dr = np.maximum(np.maximum(lo - r, r - hi), 0.0)  # distance from the centre to each row band
        dc = np.maximum(np.maximum(lo - c, c - hi), 0.0)
        out |= (dr[:, None] ** 2 + dc[None, :] ** 2) <= rad * rad
    return out


#: One example: input, label, target cells, largest nodule (mm), nodules as (row, col, radius) in input pixels.
_Example = tuple[np.ndarray, int, np.ndarray, float, np.ndarray]


def _one(args: tuple[int, int, InputParams, float]) -> _Example:
    seed, i, params, p_nodule = args
    truth = synthetic.generate_slice(np.random.default_rng([seed, i]), p_nodule=p_nodule)
    x = synthetic.model_input(truth, params.as_mapping())
    rows, cols = truth.shape
    fy, fx = params.size / rows, params.size / cols
    nods = np.asarray(
        [((r + 0.5) * fy - 0.5, (c + 0.5) * fx - 0.5, d / 2.0 / truth.pixel_spacing_mm[0] * fy)
         for r, c, d, _ in truth.nodules],
        dtype=np.float32,
    ).reshape(-1, 3)
    target = cells_hit(nods, params.grid, params.stride)
    return x.astype(np.float16), int(truth.has_nodule), target.astype(np.uint8), truth.max_nodule_mm, nods


def _work(chunk: Sequence[tuple[int, int, InputParams, float]]) -> list[_Example]:
    return [_one(a) for a in chunk]


def generate_pool(
    seed: int,
    n: int,
    params: InputParams | None = None,
    *,
    p_nodule: float = 0.5,
    workers: int = 1,
    progress: bool = False,
) -> Pool:
    """Generate ``n`` slices for ``seed`` and return them as a :class:`Pool`.

    Args:
        seed: the pool seed.
        n: number of slices.
        params: input contract (default :class:`InputParams`).
        p_nodule: fraction of positive slices drawn.
        workers: processes to generate with (the result does not depend on it).
        progress: show a tqdm progress bar.
    """
    params = params or InputParams()
    jobs = [(seed, i, params, p_nodule) for i in range(n)]
    chunk = 64
    chunks = [jobs[k:k + chunk] for k in range(0, n, chunk)]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc=f"generate seed {seed}", unit="slice")
    results: list[_Example] = []
    if workers > 1:
        with ProcessPoolExecutor(workers) as ex:
            for part in ex.map(_work, chunks):
                results.extend(part)
                if bar:
                    bar.update(len(part))
    else:
        for c in chunks:
            results.extend(_work(c))
            if bar:
                bar.update(len(c))
    if bar:
        bar.close()
    pool = Pool(
        x=np.stack([r[0] for r in results]) if results else np.zeros((0, 1, params.size, params.size), np.float16),
        label=np.asarray([r[1] for r in results], dtype=np.uint8),
        target=np.stack([r[2] for r in results]) if results else np.zeros((0, params.grid, params.grid), np.uint8),
        max_diameter_mm=np.asarray([r[3] for r in results], dtype=np.float32),
        nodules=[r[4] for r in results],
        params=params,
    )
    log.info("pool seed=%d n=%d positives=%d", seed, n, int(pool.label.sum()))
    return pool


def curriculum_weights(pool: Pool, progress: float) -> np.ndarray:
    """Sampling weights for one epoch: large nodules first, then uniform.

    Positives are weighted by ``(d / 4 mm) ** gamma`` with gamma falling from 1.5 to 0 over the first 60 % of
    training; negatives keep weight 1 scaled so that the positive share stays as drawn.

    Args:
        pool: the training pool.
        progress: fraction of training done, in [0, 1].
    """
    gamma = 1.5 * max(0.0, 1.0 - progress / 0.6)
    w = np.ones(len(pool), dtype=np.float64)
    pos = pool.label == 1
    if pos.any() and gamma > 0:
        wp = (np.maximum(pool.max_diameter_mm[pos], 4.0) / 4.0) ** gamma
        w[pos] = wp / wp.mean()
    return w / w.sum() if math.isfinite(w.sum()) else np.full(len(pool), 1.0 / len(pool))
