"""Evaluation of ONNX artifacts with ONNX Runtime only (no torch): quality on a slice pool, and engine time.

Metrics (all from one pass over a :class:`~appliance.modelbuild.data.Pool`):

* ``auc``: ROC AUC of ``prob`` over all slices; ``auc_lt8mm``: positives whose largest nodule is < 8 mm
  against all negatives.
* ``sens_at_spec90``: sensitivity at the threshold that keeps specificity >= 0.9 (also ``_lt8mm``).
* ``hit_rate``: over positive slices, the share whose heatmap peak cell overlaps a nodule (also ``_lt8mm``).
* ``sens_at_threshold`` / ``spec_at_threshold`` at the manifest's decision threshold.
* ``ms_per_batch``: median (and p10) wall time of one fixed batch on one intra-op thread, ORT_SEQUENTIAL,
  ORT_ENABLE_ALL, the session config entries the manifest asks for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from appliance.modelbuild.data import Pool, cells_hit

__all__ = [
    "auc",
    "evaluate_artifact",
    "make_session",
    "predict",
    "quality_metrics",
    "sensitivity_at_specificity",
    "time_batches",
    "time_interleaved",
]

log = logging.getLogger(__name__)


def make_session(path: Path, *, threads: int = 1, session_config: Mapping[str, str] | None = None,
                 profile_prefix: str | None = None) -> Any:
    """Return an ORT CPU session configured as the daemon configures it.

    Args:
        path: the ONNX file.
        threads: intra-op threads.
        session_config: extra session config entries (``[artifacts.<p>.session_config]``).
        profile_prefix: when set, enable ORT's profiler writing JSON with this prefix.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    for k, v in (session_config or {}).items():
        so.add_session_config_entry(k, v)
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


def predict(session: Any, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run ``x`` [N, 1, H, W] through a fixed-batch session; return (prob [N], heatmap [N, g, g]).

    The last partial batch is padded with zeros and the padding dropped.
    """
    inp = session.get_inputs()[0]
    b = int(inp.shape[0])
    probs, maps = [], []
    for k in range(0, len(x), b):
        chunk = np.asarray(x[k:k + b], dtype=np.float32)
        n = len(chunk)
        if n < b:
            chunk = np.concatenate([chunk, np.zeros((b - n, *chunk.shape[1:]), np.float32)])
        prob, heat = session.run(None, {inp.name: chunk})
        probs.append(prob[:n, 0])
        maps.append(heat[:n])
    return np.concatenate(probs), np.concatenate(maps)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Return the ROC AUC (Mann-Whitney U with tie correction); NaN if one class is empty."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def sensitivity_at_specificity(scores: np.ndarray, labels: np.ndarray, specificity: float = 0.9) -> float:
    """Return the sensitivity at the lowest threshold whose specificity is >= ``specificity``."""
    labels = np.asarray(labels).astype(bool)
    neg = np.sort(np.asarray(scores, dtype=np.float64)[~labels])
    pos = np.asarray(scores, dtype=np.float64)[labels]
    if len(neg) == 0 or len(pos) == 0:
        return float("nan")
    k = int(np.ceil(specificity * len(neg))) - 1
    thr = neg[min(max(k, 0), len(neg) - 1)]
    return float((pos > thr).mean())


def _hits(heatmaps: np.ndarray, pool: Pool) -> np.ndarray:
    g, stride = pool.params.grid, pool.params.stride
    out = np.zeros(len(pool), dtype=bool)
    for i in np.flatnonzero(pool.label):
        peak = np.unravel_index(int(np.argmax(heatmaps[i])), heatmaps[i].shape)
        out[i] = bool(cells_hit(pool.nodules[i], g, stride)[peak])
    return out


def quality_metrics(probs: np.ndarray, heatmaps: np.ndarray, pool: Pool, threshold: float = 0.5) -> dict[str, Any]:
    """Return the quality metrics of predictions on ``pool`` (see the module docstring)."""
    y = pool.label.astype(bool)
    small = y & (pool.max_diameter_mm < 8.0)
    keep_small = small | ~y
    hits = _hits(heatmaps, pool)
    return {
        "n": int(len(pool)),
        "n_pos": int(y.sum()),
        "n_pos_lt8mm": int(small.sum()),
        "auc": auc(probs, y),
        "auc_lt8mm": auc(probs[keep_small], y[keep_small]),
        "sens_at_spec90": sensitivity_at_specificity(probs, y, 0.9),
        "sens_at_spec90_lt8mm": sensitivity_at_specificity(probs[keep_small], y[keep_small], 0.9),
        "hit_rate": float(hits[y].mean()) if y.any() else float("nan"),
        "hit_rate_lt8mm": float(hits[small].mean()) if small.any() else float("nan"),
        "threshold": threshold,
        "sens_at_threshold": float((probs[y] >= threshold).mean()) if y.any() else float("nan"),
        "spec_at_threshold": float((probs[~y] < threshold).mean()) if (~y).any() else float("nan"),
    }


def time_batches(session: Any, x: np.ndarray | None = None, *, runs: int = 20, warmup: int = 3) -> dict[str, float]:
    """Time one fixed batch ``x`` (default: uniform noise); return median and p10 ms.

    Time with real slices: the values flowing through the graph can change kernel speed (subnormals).
    """
    inp = session.get_inputs()[0]
    if x is None:
        x = np.random.default_rng(0).random([int(d) for d in inp.shape], dtype=np.float32)
    for _ in range(warmup):
        session.run(None, {inp.name: x})
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, {inp.name: x})
        times.append((time.perf_counter() - t) * 1e3)
    return {"ms_per_batch": float(np.median(times)), "ms_per_batch_p10": float(np.percentile(times, 10))}


def time_interleaved(sessions: Mapping[str, Any], x: np.ndarray, *, rounds: int = 30,
                     warmup: int = 3) -> dict[str, dict[str, float]]:
    """Time several sessions on the same batch round-robin (shuffled per round); median and p10 ms each.

    Interleaving makes the comparison fair on a shared machine, where load drifts from minute to minute.
    """
    for s in sessions.values():
        for _ in range(warmup):
            s.run(None, {s.get_inputs()[0].name: x})
    times: dict[str, list[float]] = {k: [] for k in sessions}
    rng = np.random.default_rng(0)
    keys = list(sessions)
    for _ in range(rounds):
        for i in rng.permutation(len(keys)):
            s = sessions[keys[i]]
            t = time.perf_counter()
            s.run(None, {s.get_inputs()[0].name: x})
            times[keys[i]].append((time.perf_counter() - t) * 1e3)
    return {k: {"ms_per_batch": float(np.median(v)), "ms_per_batch_p10": float(np.percentile(v, 10))}
            for k, v in times.items()}


def evaluate_artifact(path: Path, pool: Pool, *, session_config: Mapping[str, str] | None = None,
                      threshold: float = 0.5, timing_runs: int = 20) -> dict[str, Any]:
    """Evaluate one artifact on ``pool`` and time it on one thread; return the metrics dict."""
    sess = make_session(path, threads=1, session_config=session_config)
    t = time.perf_counter()
    probs, maps = predict(sess, pool.x)
    m = quality_metrics(probs, maps, pool, threshold)
    m["eval_s"] = round(time.perf_counter() - t, 2)
    if timing_runs:
        b = int(sess.get_inputs()[0].shape[0])
        m.update(time_batches(sess, pool.x[:b].astype(np.float32), runs=timing_runs))
        m["batch"] = b
    log.info("eval %s: auc %.4f auc<8mm %.4f hit %.3f", path.name, m["auc"], m["auc_lt8mm"], m["hit_rate"])
    return m
