"""Measure a model on half-resolution JPEG 2000 input and record whether its pipelines may use it.

``appliance models lowpass ct-nodule`` runs :func:`record_lowpass`: it stores each held-out slice (the manifest's
eval seed) as JPEG 2000 lossless DICOM and runs the serving pipeline on it twice, decoding in full (the area-resize
contract, bit for bit what training saw) and at half resolution (the 5/3 low-pass band, re-centred;
docs/dicom.md). Each artifact scores both inputs; the model may take the second only if no artifact's AUC falls
by more than :data:`AUC_GATE`. The result goes into ``model.toml``: ``[input.preprocess] jpeg2000_lowpass`` (true,
or absent) and ``[metrics.<precision>.jpeg2000_lowpass]``, and a section of the model card ``README.md``.
``appliance models build`` and ``appliance models derive`` run it too.
"""

from __future__ import annotations

import logging
import statistics
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from appliance.manifest import Manifest, load_manifest
from appliance.modelbuild.evaluate import auc, make_session, predict
from appliance.pipeline.loader import build_steps
from appliance.pipeline.preprocess import Accept, Pipeline
from appliance.pipeline.steps import InvertMonochrome1, ModalityLut, Normalize, Resize, Window

__all__ = ["AUC_GATE", "contract_pipeline", "lowpass_inputs", "measure", "merge", "passes_gate", "record_lowpass"]

#: The largest AUC loss (any artifact, held-out seed) that still lets pipelines decode JPEG 2000 at half resolution.
AUC_GATE = 0.002


def contract_pipeline(manifest: Manifest, *, lowpass: bool) -> Pipeline:
    """Return a pipeline that applies exactly ``manifest``'s ``[input.preprocess]`` contract (any modality).

    Args:
        manifest: a model whose contract has a fixed window and an area resize.
        lowpass: let the resize step take a JPEG 2000 frame's half-resolution low-pass band.
    """
    pre = manifest.input.preprocess
    norm = (Normalize(kind="meanstd", mean=float(pre["mean"]), std=float(pre["std"]))
            if pre.get("normalize") == "meanstd" else Normalize())
    params = (ModalityLut(), Window(center=float(pre["window_center"]), width=float(pre["window_width"])),
              InvertMonochrome1(), Resize(jpeg2000_lowpass=lowpass), norm)
    steps = build_steps(params, f"model {manifest.name!r} contract:")
    return Pipeline(name=f"{manifest.name}-contract", model=manifest.name, input_shape=manifest.input.item_shape,
                    steps=steps, accept=Accept(None, None, "reject"), path=manifest.path)


def passes_gate(metrics: dict[str, dict[str, Any]]) -> bool:
    """True when there is at least one artifact and none lost more than :data:`AUC_GATE` (NaN fails)."""
    return bool(metrics) and all(float(m["auc_delta"]) >= -AUC_GATE for m in metrics.values())


def _inputs(job: tuple[Path, int, range]) -> tuple[np.ndarray, ...]:
    from pydicom.uid import JPEG2000Lossless

    from appliance.dicom import parse
    from appliance.tools import synthetic

    manifest_path, seed, indices = job
    logging.getLogger("openjpeg").setLevel(logging.WARNING)  # the encoder logs every tile at INFO
    manifest = load_manifest(manifest_path)
    full, low = contract_pipeline(manifest, lowpass=False), contract_pipeline(manifest, lowpass=True)
    xa = np.empty((len(indices), *manifest.input.item_shape), np.float32)
    xb = np.empty_like(xa)
    labels = np.empty(len(indices), np.int64)
    banded = np.zeros(len(indices), bool)
    ms = np.full((len(indices), 2), np.nan)  # bytes-to-slot CPU ms of the full and the half-resolution run
    for k, i in enumerate(indices):
        truth = synthetic.generate_slice(np.random.default_rng([seed, i]), p_nodule=0.5)
        inst = parse(synthetic.to_dicom(truth, transfer_syntax=JPEG2000Lossless))
        for way in (0, 1) if i % 2 else (1, 0):  # alternate which runs first (the second finds warm caches)
            t0 = time.thread_time()
            info = (full, low)[way].run(inst, 0, (xa, xb)[way][k])
            ms[k, way] = (time.thread_time() - t0) * 1000.0
            if way:
                banded[k] = info.lowpass
        labels[k] = int(truth.has_nodule)
    return xa, xb, labels, banded, ms


def lowpass_inputs(manifest: Manifest, seed: int, n: int, workers: int = 1) -> dict[str, Any]:
    """Build the held-out slices' model inputs both ways through the serving pipeline.

    Returns a dict with ``full`` and ``lowpass`` (float32 ``[n, C, H, W]``), ``labels``, ``banded`` (the slices
    decoded at half resolution: those at least twice the model's size) and, on those, the median bytes-to-slot
    CPU ms of both ways.
    """
    step = -(-n // max(1, workers))
    jobs = [(manifest.path, seed, range(a, min(n, a + step))) for a in range(0, n, step)]
    if workers > 1:
        with ProcessPoolExecutor(workers) as ex:
            parts = list(ex.map(_inputs, jobs))
    else:
        parts = [_inputs(j) for j in jobs]
    banded = np.concatenate([p[3] for p in parts])
    ms = np.concatenate([p[4] for p in parts])[banded]
    return {
        "full": np.concatenate([p[0] for p in parts]), "lowpass": np.concatenate([p[1] for p in parts]),
        "labels": np.concatenate([p[2] for p in parts]), "banded": banded,
        "ms_full": statistics.median(ms[:, 0]) if len(ms) else float("nan"),
        "ms_lowpass": statistics.median(ms[:, 1]) if len(ms) else float("nan"),
    }


def measure(manifest: Manifest, seed: int, n: int, workers: int = 1) -> tuple[bool, dict[str, dict[str, Any]]]:
    """Score every artifact on both inputs; return (allowed, per-precision metrics)."""
    data = lowpass_inputs(manifest, seed, n, workers)
    xa, xb, y, banded = data["full"], data["lowpass"], data["labels"], data["banded"]
    diff = np.abs(xa[banded] - xb[banded]) if banded.any() else np.zeros(1)  # on the slices that took the band
    common = {"n": n, "n_lowpass": int(banded.sum()), "eval_seed": seed, "transfer_syntax": "JPEG 2000 lossless",
              "input_mean_abs_diff": float(diff.mean()), "input_p99_abs_diff": float(np.percentile(diff, 99)),
              "decode_ms_full": data["ms_full"], "decode_ms_lowpass": data["ms_lowpass"],
              "command": f"appliance models lowpass {manifest.name}"}
    metrics: dict[str, dict[str, Any]] = {}
    for prec in sorted(manifest.artifacts):
        art = manifest.artifact(prec)
        session = make_session(art.path, session_config=art.session_config)
        pa, pb = predict(session, xa)[0], predict(session, xb)[0]
        a_full, a_low = auc(pa, y), auc(pb, y)
        metrics[prec] = {"auc_full": a_full, "auc_lowpass": a_low, "auc_delta": a_low - a_full,
                         "label_flips": int(((pa >= 0.5) != (pb >= 0.5)).sum()), **common}
    return passes_gate(metrics), metrics


def merge(toml_text: str, allowed: bool, metrics: dict[str, dict[str, Any]]) -> str:
    """Return the manifest text with the flag and the ``jpeg2000_lowpass`` metrics replaced, all else kept."""
    from appliance.modelbuild.manifest_writer import dumps, header_of

    data = tomllib.loads(toml_text)
    pre = data["input"].setdefault("preprocess", {})
    pre.pop("jpeg2000_lowpass", None)
    if allowed:
        pre["jpeg2000_lowpass"] = True
    recorded = data.setdefault("metrics", {})
    for m in recorded.values():
        m.pop("jpeg2000_lowpass", None)
    for prec, m in metrics.items():
        recorded.setdefault(prec, {})["jpeg2000_lowpass"] = m
    return dumps(data, header_of(toml_text))


def record_lowpass(model_dir: Path, *, seed: int | None = None, n: int = 2000, workers: int = 1) -> dict[str, Any]:
    """Measure the model in ``model_dir`` on half-resolution JPEG 2000 input and record it in its ``model.toml``.

    Args:
        model_dir: e.g. ``models/ct-nodule``.
        seed: the held-out seed (default: the manifest's eval seed).
        n: slices.
        workers: processes building the inputs.
    """
    toml_path = model_dir / "model.toml"
    manifest = load_manifest(toml_path)
    seed = int(manifest.artifact().build.get("eval_seed", 2)) if seed is None else seed
    allowed, metrics = measure(manifest, seed, n, workers)
    text = merge(toml_path.read_text(encoding="utf-8"), allowed, metrics)
    staged = toml_path.with_name(toml_path.name + ".new")
    staged.write_text(text, encoding="utf-8")
    load_manifest(staged)  # what we write must load before it replaces the manifest
    staged.replace(toml_path)
    card_path = model_dir / "README.md"
    if card_path.is_file():
        from appliance.modelbuild.card import with_lowpass_section

        card_path.write_text(with_lowpass_section(card_path.read_text(encoding="utf-8"), tomllib.loads(text)),
                             encoding="utf-8")
    return {"allowed": allowed, "gate": AUC_GATE, "metrics": metrics}
