"""Build the ct-nodule reference model from a seed: data -> train -> ONNX -> INT4 -> evaluate -> manifest.

``python -m appliance.modelbuild.cli build ct-nodule`` runs :func:`build`. It writes into the model directory
(``models/ct-nodule``): the FP32 and INT4 ONNX files, the FP16 and W4A16 files derived from the FP32 one
(:mod:`appliance.modelbuild.derive`), ``model.toml``, the model card ``README.md`` and
``train_log.json``. Before overwriting, it compares the new build with the committed one (metrics and outputs
within :data:`TOLERANCE`); ``--check`` builds into a scratch directory and only compares.

NOTE(ct-nodule): the INT4 block size is chosen on the held-out evaluation set: the largest block in
``BuildConfig.blocks`` whose AUC is within ``max_auc_delta`` of FP32's (larger blocks: smaller file, faster
fused kernel); if none qualifies, the one with the smallest AUC delta, and the report says so.
"""

from __future__ import annotations

import json
import logging
import platform
import shutil
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from appliance.manifest import load_manifest, sha256_file
from appliance.modelbuild import card
from appliance.modelbuild.data import InputParams, Pool, generate_pool
from appliance.modelbuild.evaluate import evaluate_artifact, make_session, predict, time_interleaved
from appliance.modelbuild.manifest_writer import write_manifest
from appliance.modelbuild.train import TrainConfig, TrainResult

__all__ = ["SESSION_CONFIG", "TOLERANCE", "BuildConfig", "BuildReport", "build", "compare_builds", "report_dict"]

log = logging.getLogger(__name__)

# How far a rebuild may drift from the committed artifacts and still count as a reproduction. Training is
# deterministic for a given torch build, CPU and thread count, but float reductions differ across them.
TOLERANCE = {"auc": 0.01, "mean_abs_prob": 0.03}

# ONNX Runtime session config the daemon must apply per precision (manifest [artifacts.<p>.session_config]).
# accuracy level 0: the fused INT4 MatMul keeps fp32 activations instead of quantizing them to int8 on every
# call (level 4, the default), which was slower and less accurate here (see the model card).
SESSION_CONFIG = {"fp32": {}, "int4": {"session.qdq_matmulnbits_accuracy_level": "0"}}


@dataclass(frozen=True)
class BuildConfig:
    """Everything a build depends on; recorded in the manifest."""

    name: str = "ct-nodule"
    version: str = "1.0.0"
    train_seed: int = 1  # training pool seed
    train_n: int = 10000  # training pool size
    eval_seed: int = 2  # held-out evaluation seed (never used in training)
    eval_n: int = 2000
    batch: int = 8  # fixed batch compiled into the graphs
    blocks: tuple[int, ...] = (32, 64, 128)  # INT4 block sizes tried
    max_auc_delta: float = 0.005
    workers: int = 2  # data generation processes
    params: InputParams = field(default_factory=InputParams)
    train: TrainConfig = field(default_factory=TrainConfig)


@dataclass
class BuildReport:
    """What a build produced."""

    out_dir: Path
    metrics: dict[str, dict[str, Any]]
    block_size: int
    candidates: dict[int, dict[str, Any]]
    seconds: dict[str, float]
    comparison: dict[str, Any] | None = None


def _net_config(params: InputParams) -> Any:
    from appliance.modelbuild.net import NetConfig

    return NetConfig(image=params.size)


def _choose_block(fp32_auc: float, candidates: dict[int, dict[str, Any]], max_delta: float) -> int:
    ok = [b for b, m in candidates.items() if abs(m["auc"] - fp32_auc) <= max_delta]
    if ok:
        return max(ok)
    log.warning("no INT4 block size is within %.4f AUC of FP32; taking the closest", max_delta)
    return min(candidates, key=lambda b: abs(candidates[b]["auc"] - fp32_auc))


def _manifest_data(cfg: BuildConfig, files: dict[str, Path], block: int, metrics: dict[str, dict[str, Any]],
                   build_info: dict[str, Any]) -> dict[str, Any]:
    p = cfg.params
    b, g = cfg.batch, p.grid
    artifacts: dict[str, Any] = {}
    for prec, path in files.items():
        art: dict[str, Any] = {
            "file": path.name,
            "precision": prec,
            "sha256": sha256_file(path),
            "bytes": path.stat().st_size,
        }
        if prec == "int4":
            art["block_size"] = block
            art["quantization"] = "weight-only symmetric INT4, DequantizeLinear(axis=0, block_size) -> MatMul"
        art["build"] = build_info
        if SESSION_CONFIG[prec]:
            art["session_config"] = dict(SESSION_CONFIG[prec])
        artifacts[prec] = art
    return {
        "format_version": 1,
        "name": cfg.name,
        "version": cfg.version,
        "description": "Lung nodule (>= 4 mm) score and coarse localisation map for one axial CT slice; "
                       "trained on synthetic phantoms only, not for clinical use",
        "default_precision": "int4",
        "input": {
            "name": "image",
            "shape": [b, 1, p.size, p.size],
            "dtype": "float32",
            "preprocess": {
                "window_center": p.window_center,
                "window_width": p.window_width,
                "resize": "area",
                "normalize": "window_unit",
                "photometric": "MONOCHROME2",
                "order": ["modality_lut", "window", "invert_monochrome1", "resize"],
            },
        },
        "outputs": [
            {"name": "prob", "shape": [b, 1],
             "meaning": "probability that the slice contains a lung nodule >= 4 mm (sigmoid applied)"},
            {"name": "heatmap", "shape": [b, g, g],
             "meaning": f"per-cell probability that the cell overlaps a nodule; cell (i, j) covers model-input "
                        f"rows {p.stride}i..{p.stride}i+{p.stride - 1} and cols {p.stride}j..{p.stride}j+"
                        f"{p.stride - 1}"},
        ],
        "postprocess": {
            "threshold": 0.5,
            "labels": ["no_nodule", "nodule"],
            "heatmap_output": "heatmap",
            "heatmap_stride_px": p.stride,
            "heatmap_grid": [g, g],
            "heatmap_geometry": "cell (i, j) centre in original pixels: row = (i + 0.5) * stride * rows / H, "
                                "col = (j + 0.5) * stride * cols / W (area resize maps the image edges onto "
                                "each other)",
        },
        "artifacts": artifacts,
        "metrics": metrics,
    }


def compare_builds(new_dir: Path, old_dir: Path, pool: Pool, n_sample: int = 64) -> dict[str, Any]:
    """Compare two model directories: metrics and outputs on a fixed sample, against :data:`TOLERANCE`.

    Returns a dict with per-precision figures and ``ok``.
    """
    new_m, old_m = load_manifest(new_dir / "model.toml"), load_manifest(old_dir / "model.toml")
    out: dict[str, Any] = {"ok": True, "tolerance": TOLERANCE}
    x = pool.x[:n_sample]
    for prec in sorted(set(new_m.artifacts) & set(old_m.artifacts)):
        a_new, a_old = new_m.artifacts[prec], old_m.artifacts[prec]
        p_new, _ = predict(make_session(a_new.path, session_config=a_new.session_config), x)
        p_old, _ = predict(make_session(a_old.path, session_config=a_old.session_config), x)
        d_auc = abs(float(new_m.metrics[prec]["auc"]) - float(old_m.metrics[prec]["auc"]))
        mad = float(np.abs(p_new - p_old).mean())
        ok = d_auc <= TOLERANCE["auc"] and mad <= TOLERANCE["mean_abs_prob"]
        out[prec] = {"identical": a_new.sha256 == a_old.sha256, "auc_delta": d_auc, "mean_abs_prob": mad,
                     "ok": ok}
        out["ok"] = out["ok"] and ok
    return out


def build(cfg: BuildConfig, out_dir: Path, *, check_only: bool = False, progress: bool = True,
          state_file: Path | None = None) -> BuildReport:
    """Run the whole build and return its report.

    Args:
        cfg: the build configuration.
        out_dir: the model directory (``models/ct-nodule``). Its current contents, if any, are the reference
            for the reproducibility comparison.
        check_only: build in a scratch directory and compare with ``out_dir`` without writing to it.
        progress: show progress bars.
        state_file: when given and present, load the trained weights from it instead of training (to redo
            export, quantization and evaluation); when given and absent, save them there after training.
    """
    from appliance.modelbuild.derive import derive_files, gpu_manifest_entries
    from appliance.modelbuild.export import export_onnx
    from appliance.modelbuild.lowpass import record_lowpass
    from appliance.modelbuild.quantize import inspect_int4, quantize_int4
    from appliance.modelbuild.train import train

    t0 = time.monotonic()
    secs: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-build-"))
    try:
        train_pool = generate_pool(cfg.train_seed, cfg.train_n, cfg.params, workers=cfg.workers, progress=progress)
        eval_pool = generate_pool(cfg.eval_seed, cfg.eval_n, cfg.params, workers=cfg.workers, progress=progress)
        secs["data"] = time.monotonic() - t0
        net_cfg = _net_config(cfg.params)
        t = time.monotonic()
        if state_file is not None and state_file.is_file():
            import torch

            saved = torch.load(state_file, weights_only=False)
            result = TrainResult(state=saved["state"], log=saved["log"], seconds=saved["seconds"],
                                 steps_done=saved["steps_done"])
            log.info("loaded trained weights from %s (training skipped)", state_file)
        else:
            result = train(train_pool, net_cfg, cfg.train, progress=progress)
            if state_file is not None:
                import torch

                torch.save({"state": result.state, "log": result.log, "seconds": result.seconds,
                            "steps_done": result.steps_done}, state_file)
        del train_pool
        secs["train"] = result.seconds
        t = time.monotonic()
        fp32 = work / f"{cfg.name}.fp32.onnx"
        export_onnx(result.state, net_cfg, fp32, batch=cfg.batch)
        metrics = {"fp32": evaluate_artifact(fp32, eval_pool, session_config=SESSION_CONFIG["fp32"])}
        candidates: dict[int, dict[str, Any]] = {}
        for block in cfg.blocks:
            path = work / f"{cfg.name}.int4-b{block}.onnx"
            quantize_int4(fp32, path, block)
            m = evaluate_artifact(path, eval_pool, session_config=SESSION_CONFIG["int4"])
            m["bytes"] = path.stat().st_size
            candidates[block] = m
        block = _choose_block(metrics["fp32"]["auc"], candidates, cfg.max_auc_delta)
        # Re-time every artifact interleaved on the same real batch (the per-artifact times above were taken
        # minutes apart, under whatever load the machine had then).
        sessions = {"fp32": make_session(fp32, session_config=SESSION_CONFIG["fp32"])}
        for b in cfg.blocks:
            sessions[f"b{b}"] = make_session(work / f"{cfg.name}.int4-b{b}.onnx",
                                             session_config=SESSION_CONFIG["int4"])
        timing = time_interleaved(sessions, eval_pool.x[:cfg.batch].astype(np.float32))
        metrics["fp32"].update(timing["fp32"])
        for b in cfg.blocks:
            candidates[b].update(timing[f"b{b}"])
        del sessions
        int4 = work / f"{cfg.name}.int4.onnx"
        shutil.copyfile(work / f"{cfg.name}.int4-b{block}.onnx", int4)
        metrics["int4"] = dict(candidates[block])
        metrics["int4"]["auc_delta_vs_fp32"] = metrics["int4"]["auc"] - metrics["fp32"]["auc"]
        metrics["int4"]["fraction_weights_int4"] = inspect_int4(int4).fraction_quantized
        metrics["int4"]["block_candidates"] = {
            f"b{b}": {"auc": m["auc"], "auc_lt8mm": m["auc_lt8mm"], "ms_per_batch": m["ms_per_batch"],
                      "bytes": m["bytes"]} for b, m in candidates.items()}
        for prec in metrics:
            metrics[prec]["eval_seed"] = cfg.eval_seed
        secs["export_quantize_eval"] = time.monotonic() - t
        secs["total"] = time.monotonic() - t0
        build_info = {
            "command": f"python -m appliance.modelbuild.cli build {cfg.name}",
            "train_seed": cfg.train_seed, "train_n": cfg.train_n, "eval_seed": cfg.eval_seed,
            "eval_n": cfg.eval_n, "train_steps": result.steps_done, "train_s": round(secs["train"], 1),
            "build_s": round(secs["total"], 1), "torch": _version("torch"), "onnx": _version("onnx"),
            "onnxruntime": _version("onnxruntime"), "python": platform.python_version(),
            "net": json.dumps(net_cfg.as_dict(), sort_keys=True),
            "train_config": json.dumps(cfg.train.as_dict(), sort_keys=True),
        }
        stage = work / "out"
        stage.mkdir()
        files = {"fp32": stage / fp32.name, "int4": stage / int4.name}
        shutil.copyfile(fp32, files["fp32"])
        shutil.copyfile(int4, files["int4"])
        data = _manifest_data(cfg, files, block, metrics, build_info)
        # The strongly typed GPU artifacts (FP16, W4A16) from the new FP32 file (appliance.modelbuild.derive).
        gpu_files = derive_files(files["fp32"], stage, cfg.name, block)
        refs = {"fp16": (files["fp32"], SESSION_CONFIG["fp32"]), "w4a16": (files["int4"], SESSION_CONFIG["int4"])}
        gpu_art, gpu_metrics = gpu_manifest_entries(gpu_files, refs, block, eval_pool, metrics["fp32"]["auc"],
                                                    {**build_info, "from": files["fp32"].name})
        for m in gpu_metrics.values():
            m["eval_seed"] = cfg.eval_seed
        data["artifacts"].update(gpu_art)
        data["metrics"].update(gpu_metrics)
        write_manifest(stage / "model.toml", data, header=card.MANIFEST_HEADER)
        (stage / "train_log.json").write_text(json.dumps(result.log, indent=1) + "\n", encoding="utf-8")
        load_manifest(stage / "model.toml")  # what we wrote must load
        # Half-resolution JPEG 2000 input, measured on the same seed (appliance.modelbuild.lowpass).
        record_lowpass(stage, seed=cfg.eval_seed, n=cfg.eval_n, workers=cfg.workers)
        data = tomllib.loads((stage / "model.toml").read_text(encoding="utf-8"))
        comparison = None
        if (out_dir / "model.toml").is_file():
            comparison = compare_builds(stage, out_dir, eval_pool)
            log.info("reproducibility vs %s: %s", out_dir, json.dumps(comparison, sort_keys=True))
        card_text = card.with_lowpass_section(card.render(data, secs, block, candidates, comparison), data)
        (stage / "README.md").write_text(card_text, encoding="utf-8")
        if not check_only:
            out_dir.mkdir(parents=True, exist_ok=True)
            for f in stage.iterdir():
                shutil.copyfile(f, out_dir / f.name)
        return BuildReport(out_dir, metrics, block, candidates, secs, comparison)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "unknown"


def report_dict(report: BuildReport) -> dict[str, Any]:
    """The report as JSON-able data."""
    d = asdict(report)
    d["out_dir"] = str(report.out_dir)
    return d
