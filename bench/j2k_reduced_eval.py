"""Lead: decode JPEG 2000 at the model's resolution (the wavelet's level-1 low-pass band) instead of full size.

For held-out slices (seed, n) it stores each phantom as JPEG 2000 lossless, then builds the model input two ways:
A, the contract (full decode -> window -> area resize; identical to ``synthetic.model_input``) and B, Pillow's
``reduce = 1`` decode (half size, the LL band) -> window -> area resize only if still larger than the model input.
It reports the CPU cost of both decodes, the input difference, and the paired AUC of the INT4 model on A and B.

Usage: python bench/j2k_reduced_eval.py [SEED=2] [N=1000]
"""

from __future__ import annotations

import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pydicom
from PIL import Image
from pydicom.encaps import generate_frames
from pydicom.uid import JPEG2000Lossless

from appliance.manifest import load_manifest
from appliance.modelbuild.evaluate import auc, make_session
from appliance.pipeline.kernels import resize_area, window_to_unit
from appliance.tools import synthetic
from appliance.tools.synthetic.series import RESCALE_INTERCEPT

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    seed = int(argv[1]) if len(argv) > 1 else 2
    n = int(argv[2]) if len(argv) > 2 else 1000
    manifest = load_manifest(REPO / "models" / "ct-nodule" / "model.toml")
    art = manifest.artifact()
    size = manifest.input.shape[2]
    pre = manifest.input.preprocess
    center, width = float(pre["window_center"]), float(pre["window_width"])
    xa, xb, labels, t_full, t_red = [], [], [], [], []
    for i in range(n):
        truth = synthetic.generate_slice(np.random.default_rng([seed, i]), p_nodule=0.5)
        data = synthetic.to_dicom(truth, transfer_syntax=JPEG2000Lossless)
        ds = pydicom.dcmread(io.BytesIO(data))
        cs = next(generate_frames(ds.PixelData, number_of_frames=1))
        xa.append(synthetic.model_input(truth, {"window_center": center, "window_width": width,
                                                "size": (size, size)}))
        shift = 2 ** (16 - int(ds.BitsStored))  # Pillow widens 12-bit samples to 16 bits (a left shift)
        t0 = time.thread_time()
        im = Image.open(io.BytesIO(cs))
        im.load()
        t_full.append((time.thread_time() - t0) * 1000)
        reduce = 1 if min(truth.shape) >= 2 * size else 0
        t0 = time.thread_time()
        im = Image.open(io.BytesIO(cs))
        im.reduce = reduce
        im.load()
        t_red.append((time.thread_time() - t0) * 1000)
        hu = np.asarray(im, dtype=np.float32) / np.float32(shift) + np.float32(RESCALE_INTERCEPT)
        unit = window_to_unit(hu, center, width)
        xb.append((unit if unit.shape == (size, size) else resize_area(unit, (size, size)))[None])
        labels.append(int(truth.has_nodule))
    xa_, xb_, y = np.stack(xa).astype(np.float32), np.stack(xb).astype(np.float32), np.asarray(labels)
    sess = make_session(art.path, session_config=art.session_config)
    batch = manifest.input.shape[0]

    def probs(x: np.ndarray) -> np.ndarray:
        pad = (-len(x)) % batch
        xp = np.concatenate([x, np.zeros((pad, *x.shape[1:]), np.float32)])
        out = [sess.run(["prob"], {manifest.input.name: xp[k:k + batch]})[0].ravel()
               for k in range(0, len(xp), batch)]
        return np.concatenate(out)[: len(x)]

    pa, pb = probs(xa_), probs(xb_)
    print(f"seed {seed}, n {n} ({int(y.sum())} positive)")
    print(f"J2K decode CPU ms, median: full {statistics.median(t_full):.2f}, reduce=1 {statistics.median(t_red):.2f}")
    diff = np.abs(xa_ - xb_)
    print(f"input |A-B| mean {float(diff.mean()):.4f}, p99 {float(np.percentile(diff, 99)):.4f}")
    print(f"AUC A (contract) {auc(pa, y):.4f}, B (reduced J2K) {auc(pb, y):.4f}, delta {auc(pb, y) - auc(pa, y):+.4f}")
    print(f"prob r {float(np.corrcoef(pa, pb)[0, 1]):.4f}, mean |dp| {float(np.abs(pa - pb).mean()):.4f}, "
          f"label flips at 0.5: {int(((pa >= 0.5) != (pb >= 0.5)).sum())}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
