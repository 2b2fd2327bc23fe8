"""Training of the ct-nodule network (torch, CPU, build time only; torch is imported lazily).

Loss: BCE on the slice logit plus BCE on the per-patch logits (positive cells up-weighted), so every
nodule cell supervises the map directly. Sampling follows a curriculum from large to small nodules
(:func:`appliance.modelbuild.data.curriculum_weights`). AdamW with a linear warm-up and cosine decay, random
left-right flips. Deterministic for a given seed and thread count.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from appliance.modelbuild.data import Pool, curriculum_weights

__all__ = ["TrainConfig", "TrainResult", "train"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters."""

    steps: int = 6000  # optimizer steps
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup: int = 100  # steps
    patch_weight: float = 1.0  # weight of the heatmap loss
    patch_pos_weight: float = 10.0  # BCE pos_weight for nodule cells
    threads: int = 2  # torch intra-op threads
    seed: int = 0
    time_limit_s: float = 0.0  # stop early after this long (0: no limit); the schedule is not rescaled
    crop_cells: int = 8  # phase 1 trains on crops of crop_cells x crop_cells heatmap cells (0: never)
    crop_fraction: float = 0.85  # share of the steps in the crop phase
    crop_batch: int = 32  # batch size in the crop phase
    full_batch: int = 16  # batch size on full images

    def as_dict(self) -> dict[str, Any]:
        """The config as plain data."""
        return asdict(self)


@dataclass
class TrainResult:
    """What training returns."""

    state: dict[str, Any]  # the model's state_dict
    log: list[dict[str, float]] = field(default_factory=list)  # one entry per logged step
    seconds: float = 0.0
    steps_done: int = 0


def _lr(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))


def _batch(
    pool: Pool, idx: np.ndarray, cells: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]] | None]:
    """Return (x float32 [b,1,H',W'], cell targets float32 [b,h,w], crop offsets or None) with random flips.

    Crops are aligned to the cell grid; a positive slice's crop contains one of its nodule cells 80 % of the
    time, else it is placed uniformly (and may then be negative).
    """
    stride, g = pool.params.stride, pool.params.grid
    xs, ts, offs = [], [], []
    for i in idx:
        x = pool.x[i, 0].astype(np.float32)
        t = pool.target[i].astype(np.float32)
        if rng.random() < 0.5:  # the cell grid flips exactly with the image: H is a multiple of the stride
            x, t = x[:, ::-1], t[:, ::-1]
        if cells:
            lo_r = lo_c = 0
            hi_r = hi_c = g - cells
            hits = np.argwhere(t > 0)
            if len(hits) and rng.random() < 0.8:
                r, c = hits[rng.integers(len(hits))]
                lo_r, hi_r = max(0, r - cells + 1), min(r, g - cells)
                lo_c, hi_c = max(0, c - cells + 1), min(c, g - cells)
            r0, c0 = int(rng.integers(lo_r, hi_r + 1)), int(rng.integers(lo_c, hi_c + 1))
            x = x[r0 * stride:(r0 + cells) * stride, c0 * stride:(c0 + cells) * stride]
            t = t[r0:r0 + cells, c0:c0 + cells]
            offs.append((r0, c0))
        xs.append(np.ascontiguousarray(x)[None])
        ts.append(np.ascontiguousarray(t))
    return np.stack(xs), np.stack(ts), (offs if cells else None)


def train(pool: Pool, net_cfg: Any, cfg: TrainConfig, *, progress: bool = True) -> TrainResult:
    """Train a :class:`~appliance.modelbuild.net.NoduleNet` on ``pool`` and return its weights.

    Args:
        pool: the training pool.
        net_cfg: a :class:`~appliance.modelbuild.net.NetConfig`.
        cfg: training hyper-parameters.
        progress: show a tqdm progress bar.
    """
    import torch
    from torch.nn import functional as F

    from appliance.modelbuild.net import NoduleNet

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng([cfg.seed, 23])
    model = NoduleNet(net_cfg)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "pos" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "pos" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.99),
    )
    pos_weight = torch.tensor(cfg.patch_pos_weight)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, desc="train", unit="step")
    result = TrainResult(state={})
    t0 = time.monotonic()
    ema: dict[str, float] = {}
    model.train()
    for step in range(cfg.steps):
        if step % 50 == 0:
            weights = curriculum_weights(pool, step / cfg.steps)
        crop = cfg.crop_cells > 0 and step < cfg.crop_fraction * cfg.steps
        batch = cfg.crop_batch if crop else cfg.full_batch
        idx = np.sort(rng.choice(len(pool), size=batch, replace=True, p=weights))
        xs, tgts, offsets = _batch(pool, idx, cfg.crop_cells if crop else 0, rng)
        x = torch.from_numpy(xs)
        tgt = torch.from_numpy(tgts)
        y = tgt.flatten(1).amax(dim=1, keepdim=True)  # crop label: a nodule cell is inside
        for group in opt.param_groups:
            group["lr"] = _lr(cfg, step)
        s, p = model(x, offsets)
        g2 = tgt.shape[-1] * tgt.shape[-2]
        loss_s = F.binary_cross_entropy_with_logits(s, y)
        loss_p = F.binary_cross_entropy_with_logits(p.reshape(-1, g2), tgt.reshape(-1, g2), pos_weight=pos_weight)
        loss = loss_s + cfg.patch_weight * loss_p
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for k, v in (("loss", loss.item()), ("slice", loss_s.item()), ("patch", loss_p.item())):
            ema[k] = v if k not in ema else 0.95 * ema[k] + 0.05 * v
        if bar:
            bar.update(1)
            bar.set_postfix(loss=f"{ema['loss']:.3f}", slice=f"{ema['slice']:.3f}")
        if step % 25 == 0 or step == cfg.steps - 1:
            entry = {"step": step, "lr": _lr(cfg, step), "s": time.monotonic() - t0, **ema}
            result.log.append(entry)
            log.info("step %d loss %.4f slice %.4f patch %.4f", step, ema["loss"], ema["slice"], ema["patch"])
        result.steps_done = step + 1
        if cfg.time_limit_s and time.monotonic() - t0 > cfg.time_limit_s:
            log.warning("training stopped at step %d by the %.0f s time limit", step, cfg.time_limit_s)
            break
    if bar:
        bar.close()
    model.eval()
    result.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    result.seconds = time.monotonic() - t0
    return result
