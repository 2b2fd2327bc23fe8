"""Derive the GPU artifacts (FP16, W4A16) from a model directory's FP32 file, evaluate them, record them.

``appliance models derive ct-nodule`` runs :func:`derive`: it writes ``<name>.fp16.onnx`` and
``<name>.w4a16.onnx`` next to the FP32 file (deterministically: the same bytes every run for the same
onnx/onnxruntime versions), evaluates them on the manifest's held-out seed with the same code as
``appliance models eval``, and adds ``[artifacts.fp16]``, ``[artifacts.w4a16]`` and their ``[metrics.*]`` to
``model.toml`` (and a section of the model card ``README.md``), leaving every other entry (and the default
precision) as it is; then it measures every artifact on half-resolution JPEG 2000 input again
(:mod:`appliance.modelbuild.lowpass`). ``--check`` writes nothing
and fails if the committed files differ from a fresh derivation.

How ONNX Runtime on the CPU runs a FLOAT16 graph: it has FP16 kernels for few ops, so its graph optimizer
inserts a Cast to float32 before and back to float16 after each op that lacks one. Every intermediate tensor
is therefore rounded to FP16 exactly as on the GPU, while the arithmetic inside an op runs in FP32 (as in a
GPU kernel with FP16 storage and FP32 accumulation). That is the CPU evaluation recorded here; the GPU's own
figures come from ``appliance doctor --gpu`` (docs/gpu.md).
"""

from __future__ import annotations

import filecmp
import logging
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from appliance.manifest import load_manifest, sha256_file
from appliance.modelbuild.data import InputParams, Pool, generate_pool
from appliance.modelbuild.evaluate import evaluate_artifact, make_session, predict

__all__ = ["GPU_PRECISIONS", "SESSION_CONFIG", "derive", "derive_files", "gpu_manifest_entries"]

log = logging.getLogger(__name__)

#: The derived precisions, in the order they are written.
GPU_PRECISIONS = ("fp16", "w4a16")

#: ONNX Runtime CPU session config for evaluating them (W4A16: fused INT4 MatMul without int8 activations).
SESSION_CONFIG: dict[str, dict[str, str]] = {
    "fp16": {},
    "w4a16": {"session.qdq_matmulnbits_accuracy_level": "0"},
}

_DESCRIPTION = {
    "fp16": "FP16 weights and activations (float32 I/O, one Cast at each boundary); strongly typed",
    "w4a16": "weight-only symmetric INT4, DequantizeLinear(axis=0, block_size, FLOAT16 scales) -> MatMul, "
             "FP16 activations (float32 I/O); strongly typed; the TensorRT engine's source",
}


def derive_files(fp32: Path, out_dir: Path, name: str, block_size: int) -> dict[str, Path]:
    """Write the FP16 and W4A16 files of ``fp32`` into ``out_dir``; return precision -> path."""
    from appliance.modelbuild.precision import derive_fp16, derive_w4a16

    files = {p: out_dir / f"{name}.{p}.onnx" for p in GPU_PRECISIONS}
    derive_fp16(fp32, files["fp16"])
    derive_w4a16(fp32, files["w4a16"], block_size)
    return files


def _tolerance(path: Path, session_config: dict[str, str], ref: Path, ref_config: dict[str, str],
               x: np.ndarray) -> float:
    """Twice the largest |output - reference output| on ``x``, at least 0.01.

    The reference has the same weights with FP32 activations (FP32 for ``fp16``, INT4 for ``w4a16``), so the
    difference is what FP16 activations alone cost: the bound for a GPU run against ORT on the CPU.
    """
    p_a, m_a = predict(make_session(path, session_config=session_config), x)
    p_b, m_b = predict(make_session(ref, session_config=ref_config), x)
    worst = max(float(np.abs(p_a - p_b).max()), float(np.abs(m_a - m_b).max()))
    return round(max(0.01, 2.0 * worst), 4)


def gpu_manifest_entries(files: dict[str, Path], refs: dict[str, tuple[Path, dict[str, str]]], block_size: int,
                         pool: Pool, fp32_auc: float,
                         build_info: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Evaluate derived files on ``pool``; return their ``[artifacts.*]`` and ``[metrics.*]`` tables.

    ``refs`` maps each precision to its FP32-activation twin (path, session config) for the tolerance.
    """
    from appliance.modelbuild.precision import inspect_types
    from appliance.modelbuild.quantize import inspect_int4

    artifacts: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    sample = pool.x[:64].astype(np.float32)
    for prec, path in files.items():
        art: dict[str, Any] = {"file": path.name, "precision": prec, "sha256": sha256_file(path),
                               "bytes": path.stat().st_size}
        if prec == "w4a16":
            art["block_size"] = block_size
        art["quantization"] = _DESCRIPTION[prec]
        art["tolerance"] = _tolerance(path, SESSION_CONFIG[prec], *refs[prec], sample)
        art["build"] = dict(build_info)
        if SESSION_CONFIG[prec]:
            art["session_config"] = dict(SESSION_CONFIG[prec])
        artifacts[prec] = art
        m = evaluate_artifact(path, pool, session_config=SESSION_CONFIG[prec], timing_runs=0)
        m["bytes"] = path.stat().st_size
        m["auc_delta_vs_fp32"] = m["auc"] - fp32_auc
        m["evaluated_on"] = "onnxruntime CPU (FP16 tensors, FP32 arithmetic inside each op; see derive.py)"
        types = inspect_types(path)
        m["float32_internal_tensors"] = len(types.float32_internal)
        if prec == "w4a16":
            m["fraction_weights_int4"] = inspect_int4(path).fraction_quantized
        metrics[prec] = m
    return artifacts, metrics


def _merge(toml_text: str, artifacts: dict[str, Any], metrics: dict[str, Any]) -> str:
    """Return the manifest text with the GPU entries replaced, every other entry and the header kept."""
    from appliance.modelbuild.manifest_writer import dumps, header_of

    data = tomllib.loads(toml_text)
    header = header_of(toml_text)
    for prec in GPU_PRECISIONS:
        data["artifacts"].pop(prec, None)
        data.setdefault("metrics", {}).pop(prec, None)
    data["artifacts"].update(artifacts)
    data["metrics"].update(metrics)
    return dumps(data, header)


def derive(model_dir: Path, *, seed: int | None = None, n: int = 2000, check: bool = False,
           workers: int = 1) -> dict[str, Any]:
    """Derive, evaluate and record the GPU artifacts of the model in ``model_dir``; return a report.

    Args:
        model_dir: e.g. ``models/ct-nodule`` (its ``model.toml`` must have an ``fp32`` and an ``int4`` artifact).
        seed: evaluation seed (default: the held-out seed the existing metrics used).
        n: evaluation slices.
        check: write nothing; report whether the committed files equal a fresh derivation.
        workers: data generation processes.
    """
    manifest = load_manifest(model_dir / "model.toml")
    fp32, int4 = manifest.artifact("fp32"), manifest.artifact("int4")
    fp32.verify()
    block = int4.block_size or 128
    with tempfile.TemporaryDirectory(prefix="derive-") as tmp:
        files = derive_files(fp32.path, Path(tmp), manifest.name, block)
        if check:
            same = {p: (model_dir / f.name).is_file() and filecmp.cmp(f, model_dir / f.name, shallow=False)
                    for p, f in files.items()}
            return {"check": True, "identical": same, "ok": all(same.values())}
        seed = int(fp32.build.get("eval_seed", 2)) if seed is None else seed
        pre = manifest.input.preprocess
        params = InputParams(size=manifest.input.shape[2], window_center=float(pre["window_center"]),
                             window_width=float(pre["window_width"]),
                             stride=int(manifest.postprocess.get("heatmap_stride_px", 16)))
        pool = generate_pool(seed, n, params, workers=workers)
        fp32_auc = float(manifest.metrics.get("fp32", {}).get("auc") or
                         evaluate_artifact(fp32.path, pool, timing_runs=0)["auc"])
        info = {"command": f"appliance models derive {manifest.name}", "from": fp32.path.name,
                "from_sha256": fp32.sha256, "eval_seed": seed, "eval_n": n, **_versions()}
        refs = {"fp16": (fp32.path, fp32.session_config), "w4a16": (int4.path, int4.session_config)}
        artifacts, metrics = gpu_manifest_entries(files, refs, block, pool, fp32_auc, info)
        for m in metrics.values():
            m["eval_seed"] = seed
        for f in files.values():
            f.replace(model_dir / f.name)
    toml_path = model_dir / "model.toml"
    toml_path.write_text(_merge(toml_path.read_text(encoding="utf-8"), artifacts, metrics), encoding="utf-8")
    load_manifest(toml_path)  # what we wrote must load
    # New GPU artifacts are measured on half-resolution JPEG 2000 input too (the gate covers every artifact).
    from appliance.modelbuild.lowpass import record_lowpass

    record_lowpass(model_dir, seed=seed, n=n, workers=workers)
    card_path = model_dir / "README.md"
    if card_path.is_file():
        from appliance.modelbuild.card import with_gpu_section

        data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
        card_path.write_text(with_gpu_section(card_path.read_text(encoding="utf-8"), data), encoding="utf-8")
    return {"check": False, "artifacts": artifacts, "metrics": metrics, "ok": True}


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("onnx", "onnxruntime"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "unknown"
    return out
