"""Tests of the committed ct-nodule artifacts: manifest integrity, INT4 graph structure, INT4 vs FP32."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from appliance.errors import ArtifactIntegrityError
from appliance.manifest import Manifest, load_manifest
from appliance.modelbuild.cli import eval_main
from appliance.modelbuild.data import InputParams, generate_pool
from appliance.modelbuild.evaluate import auc, make_session, predict, sensitivity_at_specificity
from appliance.modelbuild.quantize import inspect_int4

MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "ct-nodule"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(MODEL_DIR / "model.toml")


@pytest.fixture(scope="module")
def sample() -> np.ndarray:
    return generate_pool(424242, 16, InputParams()).x.astype(np.float32)


def test_manifest_verifies(manifest: Manifest) -> None:
    assert manifest.name == "ct-nodule" and manifest.default_precision == "int4"
    assert manifest.input.shape == (8, 1, 256, 256) and manifest.input.dtype == "float32"
    pre = manifest.input.preprocess
    assert (pre["window_center"], pre["window_width"], pre["resize"], pre["normalize"]) == (
        -600.0,
        1500.0,
        "area",
        "window_unit",
    )
    assert [o.name for o in manifest.outputs] == ["prob", "heatmap"]
    assert manifest.postprocess["heatmap_stride_px"] * manifest.outputs[1].shape[1] == 256
    for art in manifest.artifacts.values():
        art.verify()
        assert art.path.stat().st_size == art.size_bytes
    assert manifest.artifacts["int4"].block_size in (32, 64, 128)
    for prec in ("fp32", "int4"):
        assert manifest.metrics[prec]["n"] >= 2000
        assert manifest.metrics[prec]["eval_seed"] != manifest.artifacts[prec].build["train_seed"]


def test_sha256_mismatch_is_refused_naming_the_file(manifest: Manifest, tmp_path: Path) -> None:
    copy = tmp_path / "ct-nodule"
    shutil.copytree(MODEL_DIR, copy)
    victim = copy / manifest.artifacts["int4"].path.name
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    broken = load_manifest(copy / "model.toml")
    with pytest.raises(ArtifactIntegrityError, match=victim.name):
        broken.artifact("int4").verify()
    broken.artifact("fp32").verify()  # the untouched one still verifies


def test_int4_graph_structure(manifest: Manifest) -> None:
    int4 = inspect_int4(manifest.artifacts["int4"].path)
    fp32 = inspect_int4(manifest.artifacts["fp32"].path)
    assert int4.opset == 21 and fp32.opset == 21
    assert int4.foreign_ops == frozenset() and fp32.foreign_ops == frozenset()
    assert int4.axes == frozenset({0})
    assert int4.block_sizes == frozenset({manifest.artifacts["int4"].block_size})
    assert int4.zero_points == 0
    # every weight MatMul of the FP32 graph is fed by an INT4 DQ; only the 1-output slice-head Gemm stays float
    assert int4.weight_matmuls == fp32.float_weight_matmuls - int4.float_weight_matmuls
    assert int4.float_weight_matmuls <= 1 and int4.weight_matmuls >= 9  # 4 per block x 2 + the map head
    assert int4.fraction_quantized >= 0.6  # the conv stem and positional embedding stay float
    assert fp32.dq_nodes == 0
    for report in (int4, fp32):
        assert report.input_shapes == {"image": [8, 1, 256, 256]}
        assert report.output_shapes == {"prob": [8, 1], "heatmap": [8, 16, 16]}


def test_int4_and_fp32_agree(manifest: Manifest, sample: np.ndarray) -> None:
    out = {}
    for prec in ("fp32", "int4"):
        art = manifest.artifacts[prec]
        out[prec] = predict(make_session(art.path, session_config=art.session_config), sample)
    (p32, h32), (p4, h4) = out["fp32"], out["int4"]
    assert p32.shape == (16,) and h32.shape == (16, 16, 16)
    # Tolerances: the committed model (b128) has mean |dp| 0.007, max 0.049, heatmap max 0.063 here. INT4 moves
    # probabilities a little but keeps their order (its AUC is within 0.005 of FP32 on 2,000 slices).
    assert np.abs(p32 - p4).mean() <= 0.04
    assert np.abs(p32 - p4).max() <= 0.1
    assert np.abs(h32 - h4).max() <= 0.15
    assert np.corrcoef(np.argsort(np.argsort(p32)), np.argsort(np.argsort(p4)))[0, 1] >= 0.95
    assert ((p32 >= 0.5) == (p4 >= 0.5)).mean() >= 0.85


def test_metric_helpers() -> None:
    y = np.array([0, 0, 1, 1])
    assert auc(np.array([0.1, 0.4, 0.35, 0.8]), y) == pytest.approx(0.75)
    assert auc(np.array([0.5, 0.5, 0.5, 0.5]), y) == pytest.approx(0.5)
    assert sensitivity_at_specificity(np.array([0.1, 0.35, 0.3, 0.9]), y, 0.9) == pytest.approx(0.5)


def test_small_eval_runs_and_is_sane() -> None:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = eval_main(
            ["ct-nodule", "--seed", "777", "--n", "64", "--json", "--no-timing", "--models-dir", str(MODEL_DIR.parent)]
        )
    assert rc == 0
    result = json.loads(buf.getvalue())
    assert set(result["metrics"]) == {"fp32", "int4", "fp16", "w4a16"}
    for m in result["metrics"].values():
        assert m["n"] == 64 and 0 < m["n_pos"] < 64
        assert m["auc"] >= 0.75
        assert 0.0 <= m["hit_rate"] <= 1.0


def test_runtime_modules_do_not_import_torch() -> None:
    code = (
        "import sys, appliance.tools.synthetic, appliance.modelbuild.cli, appliance.modelbuild.evaluate, "
        "appliance.modelbuild.quantize, appliance.modelbuild.data; print('torch' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"
