"""The strongly typed GPU artifacts (FP16, W4A16): structure, same INT4 weights, reproducible, accurate on the CPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from appliance.manifest import Manifest, load_manifest
from appliance.modelbuild.cli import derive_main
from appliance.modelbuild.data import InputParams, generate_pool
from appliance.modelbuild.evaluate import make_session, predict
from appliance.modelbuild.precision import inspect_types
from appliance.modelbuild.quantize import inspect_int4

MODEL_DIR = Path(__file__).resolve().parents[1] / "models" / "ct-nodule"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(MODEL_DIR / "model.toml")


def _dq_weights(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """(INT4 values, scales as float32) of every DequantizeLinear, in graph order."""
    g = onnx.load(str(path)).graph
    inits = {t.name: t for t in g.initializer}
    out = []
    for n in g.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:
            out.append((numpy_helper.to_array(inits[n.input[0]]).astype(np.int8),
                        numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)))
    return out


def test_manifest_records_both_with_sha256_and_keeps_the_default(manifest: Manifest) -> None:
    assert manifest.default_precision == "int4"
    assert set(manifest.artifacts) == {"fp32", "int4", "fp16", "w4a16"}
    for p in ("fp16", "w4a16"):
        art = manifest.artifact(p)
        art.verify()
        assert art.size_bytes < 2 << 20 and 0 < art.tolerance <= 0.05
        m = manifest.metrics[p]
        assert m["n"] >= 2000 and m["eval_seed"] == manifest.metrics["fp32"]["eval_seed"]
        assert abs(m["auc"] - manifest.metrics["fp32"]["auc"]) <= 0.005
        assert m["float32_internal_tensors"] == 0
    assert manifest.artifact("w4a16").block_size == manifest.artifact("int4").block_size


@pytest.mark.parametrize("precision", ["fp16", "w4a16"])
def test_strongly_typed_fp16_inside_float32_io(manifest: Manifest, precision: str) -> None:
    types = inspect_types(manifest.artifact(precision).path)
    assert types.strongly_fp16 and types.float32_internal == []
    assert types.io_types == {"image": "FLOAT", "prob": "FLOAT", "heatmap": "FLOAT"}
    assert types.casts == 3  # one after the input, one before each output
    report = inspect_int4(manifest.artifact(precision).path)
    assert report.input_shapes == {"image": list(manifest.input.shape)}
    assert report.output_shapes == {o.name: list(o.shape) for o in manifest.outputs}
    assert report.foreign_ops == frozenset()
    assert not inspect_types(manifest.artifact("int4").path).strongly_fp16  # the INT4 artifact keeps FP32


def test_w4a16_has_the_int4_artifacts_exact_weights_with_fp16_scales(manifest: Manifest) -> None:
    w4 = inspect_int4(manifest.artifact("w4a16").path)
    int4 = inspect_int4(manifest.artifact("int4").path)
    assert (w4.dq_nodes, w4.axes, w4.block_sizes, w4.zero_points) == (int4.dq_nodes, int4.axes, int4.block_sizes, 0)
    assert inspect_types(manifest.artifact("w4a16").path).dq_output_types == frozenset({"FLOAT16"})
    a, b = _dq_weights(manifest.artifact("w4a16").path), _dq_weights(manifest.artifact("int4").path)
    assert len(a) == len(b) == int4.dq_nodes
    for (qa, sa), (qb, sb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(qa, qb)
        np.testing.assert_allclose(sa, sb, rtol=1e-3)  # FLOAT16 scales


def test_derivation_is_reproducible(capsys) -> None:
    assert derive_main(["ct-nodule", "--check"]) == 0
    assert '"ok": true' in capsys.readouterr().out


def test_derive_check_fails_on_a_different_committed_file(tmp_path: Path, capsys) -> None:
    copy = tmp_path / "ct-nodule"
    shutil.copytree(MODEL_DIR, copy)
    data = bytearray((copy / "ct-nodule.fp16.onnx").read_bytes())
    data[-1] ^= 0x01
    (copy / "ct-nodule.fp16.onnx").write_bytes(bytes(data))
    assert derive_main(["ct-nodule", "--check", "--models-dir", str(tmp_path)]) == 1
    assert '"fp16": false' in capsys.readouterr().out


@pytest.mark.parametrize(("precision", "twin"), [("fp16", "fp32"), ("w4a16", "int4")])
def test_fp16_activations_stay_within_the_recorded_tolerance(manifest: Manifest, precision: str, twin: str) -> None:
    x = generate_pool(515151, 16, InputParams()).x.astype(np.float32)
    art, ref = manifest.artifact(precision), manifest.artifact(twin)
    p_a, m_a = predict(make_session(art.path, session_config=art.session_config), x)
    p_b, m_b = predict(make_session(ref.path, session_config=ref.session_config), x)
    assert float(np.abs(p_a - p_b).max()) <= art.tolerance
    assert float(np.abs(m_a - m_b).max()) <= art.tolerance
    assert float(np.abs(p_a - p_b).max()) > 0  # it really runs FP16 tensors, not the FP32 twin


def test_model_card_gpu_section_is_current() -> None:
    import tomllib

    from appliance.modelbuild.card import GPU_BEGIN, with_gpu_section

    card = (MODEL_DIR / "README.md").read_text(encoding="utf-8")
    data = tomllib.loads((MODEL_DIR / "model.toml").read_text(encoding="utf-8"))
    assert card.count(GPU_BEGIN) == 1
    assert with_gpu_section(card, data) == card  # regenerating changes nothing
