"""appliance.pipeline.preprocess: a reference table per step, the model contract, config errors, synthetic CT."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dicom_testkit import (
    CT_PIPELINE_TOML,
    REPO,
    any_grey_pipeline,
    ct_pipeline,
    make_dataset,
    to_bytes,
    write_manifest,
    write_pipeline,
)
from pydicom.data import get_testdata_file
from pydicom.dataset import Dataset
from pydicom.uid import JPEGLSNearLossless

from appliance.dicom import parse
from appliance.errors import ConfigError, DicomError, NotApplicable
from appliance.pipeline import kernels
from appliance.pipeline.kernels import resize_area, resize_area_into, window_to_unit
from appliance.pipeline.loader import load_pipeline, load_pipelines
from appliance.pipeline.steps import STEPS


def _steps_toml(steps: list[tuple[str, dict[str, Any]]]) -> str:
    lines = ['model = "m"', "[accept]", 'colour = "luminance"']
    for name, params in steps:
        lines += ["[[steps]]", f'name = "{name}"']
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in params.items()]
    return "\n".join(lines) + "\n"


def _run_tiny(tmp_path: Path, steps: list[tuple[str, dict[str, Any]]], pixels: np.ndarray, **tags: Any) -> np.ndarray:
    """Run a contract-free pipeline with a (1, 2, 2) input on one tiny frame; return the 2 x 2 output."""
    write_manifest(tmp_path / "models", name="m", shape=(1, 1, 2, 2), preprocess={})
    pipeline = load_pipeline(write_pipeline(tmp_path, _steps_toml(steps)), tmp_path / "models")
    inst = parse(to_bytes(make_dataset(pixels=pixels.astype(np.uint16), **tags)))
    pipeline.check(inst)
    out = np.full(pipeline.input_shape, np.nan, dtype=np.float32)
    pipeline.run(inst, 0, out)
    return out[0]


def _lut_sequence() -> list[Dataset]:
    item = Dataset()
    item.add_new(0x00283002, "US", [4, 0, 16])  # LUT Descriptor: 4 entries, first stored value 0, 16 bits
    item.add_new(0x00283006, "US", [10, 20, 30, 40])  # LUT Data
    item.ModalityLUTType = "HU"
    return [item]


M = ("modality_lut", {})
R = ("resize", {})


def W(center: float, width: float, source: str = "pipeline") -> tuple[str, dict[str, Any]]:  # noqa: N802
    return ("window", {"center": center, "width": width, "source": source})


INV = ("invert_monochrome1", {})
A = np.asarray

# (id, steps, stored pixels, dataset tags, expected 2 x 2 output)
REFERENCE = [
    (
        "modality-lut-and-window",
        [M, W(0, 2000), R],
        A([[0, 1024], [2048, 4095]]),
        {"RescaleSlope": 1, "RescaleIntercept": -1024},
        [[0.0, 0.5], [1.0, 1.0]],
    ),
    (
        "rescale-slope-half",
        [M, W(0, 400), R],
        A([[0, 200], [400, 1000]]),
        {"RescaleSlope": 0.5, "RescaleIntercept": -100},
        [[0.25, 0.5], [0.75, 1.0]],
    ),
    (
        "no-modality-lut-step-ignores-rescale",
        [W(100, 200), R],
        A([[0, 50], [100, 200]]),
        {"RescaleIntercept": -1024},
        [[0.0, 0.25], [0.5, 1.0]],
    ),
    (
        "modality-lut-sequence",
        [M, W(25, 40), R],
        A([[0, 1], [2, 5]]),
        {"ModalityLUTSequence": _lut_sequence(), "modality": "MR"},  # a CT's is refused (its LUT Data is unsigned)
        [[0.125, 0.375], [0.625, 0.875]],
    ),
    (
        "window-from-file-voi",
        [W(0, 2000, "file"), R],
        A([[0, 100], [150, 200]]),
        {"WindowCenter": 100, "WindowWidth": 200},
        [[0.0, 0.5], [0.75, 1.0]],
    ),
    (
        "window-file-width-0-falls-back",
        [W(1000, 2000, "file"), R],
        A([[0, 100], [150, 200]]),
        {"WindowCenter": 100, "WindowWidth": 0},
        [[0.0, 0.05], [0.075, 0.1]],
    ),
    (
        "invert-monochrome1",
        [W(100, 200), INV, R],
        A([[0, 50], [100, 200]]),
        {"PhotometricInterpretation": "MONOCHROME1", "modality": "CR"},
        [[1.0, 0.75], [0.5, 0.0]],
    ),
    (  # CT's values are Hounsfield units whatever their display: MONOCHROME1 changes nothing
        "invert-leaves-monochrome1-ct",
        [W(100, 200), INV, R],
        A([[0, 50], [100, 200]]),
        {"PhotometricInterpretation": "MONOCHROME1"},
        [[0.0, 0.25], [0.5, 1.0]],
    ),
    ("invert-leaves-monochrome2", [W(100, 200), INV, R], A([[0, 50], [100, 200]]), {}, [[0.0, 0.25], [0.5, 1.0]]),
    (
        "resize-area-4x4-to-2x2",
        [W(80, 160), R],
        A(np.arange(16).reshape(4, 4) * 10),
        {},
        [[2.5 / 16, 4.5 / 16], [10.5 / 16, 12.5 / 16]],
    ),
    (
        "normalize-meanstd",
        [W(100, 200), R, ("normalize", {"kind": "meanstd", "mean": 0.5, "std": 0.25})],
        A([[0, 50], [100, 200]]),
        {},
        [[-2.0, -1.0], [0.0, 2.0]],
    ),
    (
        "normalize-none",
        [W(100, 200), R, ("normalize", {"kind": "none"})],
        A([[0, 50], [100, 200]]),
        {},
        [[0.0, 0.25], [0.5, 1.0]],
    ),
]


@pytest.mark.parametrize(
    ("steps", "pixels", "tags", "expected"), [c[1:] for c in REFERENCE], ids=[c[0] for c in REFERENCE]
)
def test_reference_table(tmp_path, steps, pixels, tags, expected):
    out = _run_tiny(tmp_path, steps, pixels, **tags)
    np.testing.assert_allclose(out, np.asarray(expected, dtype=np.float32), rtol=0, atol=1e-6)


def test_every_registered_step_has_a_reference_row():
    covered = {name for _, steps, *_ in REFERENCE for name, _ in steps}
    assert covered == set(STEPS)


def test_monochrome1_cr_comes_out_inverted(tmp_path):
    # Like RG1_UNCI.dcm: a 12-bit MONOCHROME1 CR with a VOI window and no Presentation LUT Shape.
    rng = np.random.default_rng(7)
    stored = rng.integers(0, 4096, size=(128, 128)).astype(np.uint16)
    tags = {"modality": "CR", "WindowCenter": 2000, "WindowWidth": 3000, "RescaleSlope": 1, "RescaleIntercept": 0}
    pipeline = any_grey_pipeline(tmp_path)
    outs = {}
    for photometric in ("MONOCHROME1", "MONOCHROME2"):
        inst = parse(to_bytes(make_dataset(pixels=stored, photometric=photometric, **tags)))
        out = np.empty(pipeline.input_shape, np.float32)
        pipeline.run(inst, 0, out)
        outs[photometric] = out
    np.testing.assert_allclose(outs["MONOCHROME1"], 1.0 - outs["MONOCHROME2"], rtol=0, atol=1e-6)
    assert 0.0 <= outs["MONOCHROME1"].min() and outs["MONOCHROME1"].max() <= 1.0


def test_a_monochrome1_ct_holding_the_same_hounsfield_units_gives_the_same_model_input(tmp_path):
    # held-out review, session 17: the stored values inverted (slope -1) with the intercept to match, so the modality
    # LUT gives the very HU of the MONOCHROME2 slice; inverting after the window scored it 0.9995 against 0.136
    rng = np.random.default_rng(3)
    stored = rng.integers(0, 4096, size=(512, 512)).astype(np.uint16)
    pipeline = ct_pipeline(tmp_path)
    plain = parse(to_bytes(make_dataset(pixels=stored, RescaleSlope=1, RescaleIntercept=-1024)))
    flipped = parse(to_bytes(make_dataset(pixels=(4095 - stored).astype(np.uint16), photometric="MONOCHROME1",
                                          RescaleSlope=-1, RescaleIntercept=4095 - 1024)))
    outs = []
    for inst in (plain, flipped):
        out = np.empty(pipeline.input_shape, np.float32)
        pipeline.run(inst, 0, out)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize(
    ("src", "dst"),
    [((512, 512), (256, 256)), ((384, 384), (256, 256)), ((256, 256), (256, 256)), ((100, 60), (64, 64)),
     ((768, 768), (256, 256)), ((1024, 1024), (256, 256)), ((512, 1024), (256, 256)), ((768, 512), (256, 256)),
     ((2048, 2048), (256, 256)), ((256, 512), (256, 256))],
)
def test_resize_into_slot_is_bit_identical_to_resize_area(src, dst):
    image = np.random.default_rng(0).standard_normal(src).astype(np.float32) * np.float32(1000)
    out = np.empty(dst, np.float32)
    resize_area_into(image, out)
    np.testing.assert_array_equal(out, resize_area(image, dst))


@pytest.mark.parametrize("factors", [(2, 2), (3, 3), (4, 4), (2, 4), (1, 2)])
def test_integer_factor_resizes_take_the_strided_path_with_this_numpy(factors):
    # The fast path is used only where it is bit-identical; this says when a numpy upgrade loses it (then the
    # slot is written by np.mean: still correct, ~10x slower: docs/performance.md).
    fy, fx = factors
    assert kernels._binning_matches_kernel(fy, fx, 256, 256)


@pytest.mark.parametrize("size", [512, 384])
def test_ct_pipeline_matches_the_training_contract_exactly(tmp_path, size):
    rng = np.random.default_rng(size)
    stored = rng.integers(0, 4096, size=(size, size)).astype(np.uint16)
    inst = parse(to_bytes(make_dataset(pixels=stored, RescaleSlope=1, RescaleIntercept=-1024, PixelSpacing=[0.7, 0.7])))
    pipeline = ct_pipeline(tmp_path)
    pipeline.check(inst)
    out = np.empty(pipeline.input_shape, np.float32)
    info = pipeline.run(inst, 0, out)
    hu = stored * 1.0 + -1024.0
    expected = resize_area(window_to_unit(hu, -600.0, 1500.0), (256, 256))
    np.testing.assert_array_equal(out[0], expected)
    assert info.original_shape == (size, size)
    assert info.pixel_spacing == (0.7, 0.7)
    assert info.scale_to_original == (size / 256, size / 256)
    assert info.to_original(0, 0) == pytest.approx((0.5 * size / 256 - 0.5,) * 2)


def test_run_refuses_a_wrong_slot(tmp_path):
    pipeline = ct_pipeline(tmp_path)
    inst = parse(to_bytes(make_dataset()))
    with pytest.raises(ValueError, match="float32"):
        pipeline.run(inst, 0, np.empty((1, 128, 128), np.float32))


def _ct_rgb() -> bytes:
    ds = make_dataset(pixels=np.zeros((4, 4, 3), np.uint8), bits_stored=8)
    ds.Rows, ds.Columns, ds.SamplesPerPixel, ds.PlanarConfiguration = 4, 4, 3, 0
    ds.PhotometricInterpretation = "RGB"
    return to_bytes(ds)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (lambda: Path(get_testdata_file("MR_small.dcm")).read_bytes(), "(0008,0016) SOP Class UID"),
        (lambda: to_bytes(make_dataset(modality="MR")), "(0008,0060) Modality"),
        (_ct_rgb, "(0028,0004) Photometric Interpretation"),
    ],
    ids=["mr-sop-class", "ct-class-but-mr-modality", "colour-ct"],
)
def test_ct_pipeline_check_names_the_tag(tmp_path, data, needle):
    with pytest.raises(NotApplicable, match=r"\(") as info:
        ct_pipeline(tmp_path).check(parse(data()))
    assert needle in str(info.value)


def test_ct_pipeline_accepts_ct(tmp_path):
    ct_pipeline(tmp_path).check(parse(Path(get_testdata_file("CT_small.dcm")).read_bytes()))


BASE = CT_PIPELINE_TOML.read_text(encoding="utf-8")

# (id, replace this, with this, substrings of the ConfigError message)
CONFIG_ERRORS = [
    ("unknown-top-key", "format_version = 1", "format_version = 1\nwindow = 3",
     ["key window: unknown key", "known: accept, description"]),
    ("unknown-step", 'name = "invert_monochrome1"', 'name = "blur"', ["steps[2].name", "'blur'"]),
    ("unknown-param", "width = 1500.0", "width = 1500.0\ncentre = 1.0",
     ["key steps[1].centre: unknown key", "known: center, source, width"]),
    ("wrong-type", "width = 1500.0", 'width = "wide"', ["key steps[1].width: expected float, got str 'wide'"]),
    ("missing-param", "center = -600.0", "", ["key steps[1].center: missing (required)"]),
    ("width-below-1", "width = 1500.0", "width = 0.5", ["key steps[1].width: expected float >= 1.0, got 0.5"]),
    ("bad-source", 'source = "pipeline"', 'source = "header"',
     ["key steps[1].source: expected one of 'file', 'pipeline', got 'header'"]),
    ("resize-method", 'method = "area"', 'method = "bicubic"',
     ["key steps[3].method: expected one of 'area', got 'bicubic'"]),
    ("normalize-kind", 'kind = "none"', 'kind = "zscore"',
     ["key steps[4].kind: expected one of 'meanstd', 'none', got 'zscore'"]),
    ("order", 'name = "modality_lut"', 'name = "normalize"', ["steps[1].name", "after"]),
    (
        "accept-unknown-key",
        'colour = "reject"',
        'colour = "reject"\nbody_parts = ["CHEST"]',
        ["key accept.body_parts: unknown key", "known: colour, max_aspect, min_size, modalities, sop_classes"],
    ),
    ("accept-colour", 'colour = "reject"', 'colour = "keep"',
     ["key accept.colour: expected one of 'luminance', 'reject', got 'keep'"]),
    ("sop-class-keyword", '"CTImageStorage",', '"CTImageStorag",', ["key accept.sop_classes[0]", "'CTImageStorag'"]),
    ("model-missing", 'model = "ct-nodule"', 'model = "nope"', ["model = 'nope'"]),
    ("bad-toml", "[accept]", "[accept", ["is not valid TOML"]),
    ("format-version", "format_version = 1", "format_version = 2", ["key format_version: expected one of 1, got 2"]),
    ("center-inf", "center = -600.0", "center = inf", ["key steps[1].center: expected float <= 1000000.0, got inf"]),
    ("center-nan", "center = -600.0", "center = nan", ["key steps[1].center", "got nan"]),
    ("step-without-name", 'name = "invert_monochrome1"', "", ["key steps[2].name: missing (required)"]),
    ("empty-modalities", 'modalities = ["CT"]', "modalities = []", ["key accept.modalities", "length >= 1"]),
    ("modality-type", 'modalities = ["CT"]', "modalities = [1]", ["key accept.modalities[0]: expected str, got int 1"]),
    ("model-path", 'model = "ct-nodule"', 'model = "../ct-nodule"', ["key model", "'../ct-nodule'"]),
    # contradictions with the model's [input.preprocess] contract
    ("contract-center", "center = -600.0", "center = -500.0", ["key steps[1].center", "window_center", "-600"]),
    ("contract-width", "width = 1500.0", "width = 1400.0", ["key steps[1].width", "window_width"]),
    ("contract-file-voi", 'source = "pipeline"', 'source = "file"', ["key steps[1].source: 'file' contradicts"]),
    ("contract-normalize", 'kind = "none"', 'kind = "meanstd"\nmean = 0.5\nstd = 0.25',
     ["key steps[4].kind", "window_unit"]),
]


@pytest.mark.parametrize(("old", "new", "needles"), [c[1:] for c in CONFIG_ERRORS], ids=[c[0] for c in CONFIG_ERRORS])
def test_config_errors_name_file_and_key(tmp_path, old, new, needles):
    assert old in BASE
    write_manifest(tmp_path / "models")
    path = write_pipeline(tmp_path, BASE.replace(old, new, 1), name="ct-nodule")
    with pytest.raises(ConfigError) as info:
        load_pipeline(path, tmp_path / "models")
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('model = "m"\nsteps = 3\n', "key steps: expected array, got int 3"),
        ('model = "m"\nsteps = []\n', "key steps: expected array of length >= 1"),
        ('model = "m"\nsteps = [3]\n', "key steps[0]: expected table, got int 3"),
        ('model = "m"\naccept = "CT"\nsteps = [{name = "resize"}]\n', "key accept: expected table, got str 'CT'"),
        ('steps = [{name = "resize"}]\n', "key model: missing (required)"),
        ('model = "m"\nsteps = [{name = "resize", method = "area", x = {y = 1}}]\n',
         "key steps[0].x: unknown table [steps[0].x] (known: jpeg2000_lowpass, method)"),
        ('model = "m"\nsteps = [{name = "modality_lut", center = 1}, {name = "resize"}]\n',
         "key steps[0].center: unknown key (known: none)"),
    ],
)
def test_pipeline_shapes_are_named_by_key_path(tmp_path, text, needle):
    write_manifest(tmp_path / "models", name="m", shape=(1, 1, 2, 2), preprocess={})
    path = write_pipeline(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_pipeline(path, tmp_path / "models")
    assert f"pipeline file {path}: {needle}" in str(info.value)


def test_loaded_steps_are_typed_and_frozen(tmp_path):
    from appliance.pipeline.steps import Window

    pipeline = ct_pipeline(tmp_path)
    window = pipeline.steps[1].params
    assert isinstance(window, Window)
    assert (window.center, window.width, window.source) == (-600.0, 1500.0, "pipeline")
    with pytest.raises(AttributeError):
        window.center = 0.0  # type: ignore[misc]


@pytest.mark.parametrize("step", ["modality_lut", "invert_monochrome1", "resize"])
def test_pipeline_missing_a_contract_step_is_refused(tmp_path, step):
    write_manifest(tmp_path / "models")
    text = re.sub(rf'\[\[steps\]\]\nname = "{step}".*?(\n\n|\Z)', "", BASE, count=1, flags=re.S)
    assert text != BASE
    with pytest.raises(ConfigError, match=step):
        load_pipeline(write_pipeline(tmp_path, text, name="ct-nodule"), tmp_path / "models")


def test_load_pipelines_by_name_and_refuses_duplicates(tmp_path):
    write_manifest(tmp_path / "models")
    pipelines = load_pipelines(REPO / "pipelines", tmp_path / "models")
    assert "ct-nodule" in pipelines
    assert pipelines["ct-nodule"].input_shape == (1, 256, 256)
    folder = tmp_path / "pipelines"
    folder.mkdir()
    shutil.copy(CT_PIPELINE_TOML, folder / "a.toml")
    shutil.copy(CT_PIPELINE_TOML, folder / "b.toml")
    with pytest.raises(ConfigError, match="already used"):
        load_pipelines(folder, tmp_path / "models")


def test_repository_pipelines_load_against_the_real_models_when_present():
    models = REPO / "models"
    if not (models / "ct-nodule" / "model.toml").is_file():
        pytest.skip("models/ct-nodule/model.toml not built yet")
    pipelines = load_pipelines(REPO / "pipelines", models)
    assert pipelines["ct-nodule"].model == "ct-nodule"


# ------------------------------------------------------------------------------------------------------
# appliance.tools.synthetic: every transfer syntax it writes decodes and matches its model_input

from appliance.tools import synthetic  # noqa: E402 - a broken import must fail, not skip


def test_synthetic_every_transfer_syntax_matches_model_input(tmp_path):
    pipeline = ct_pipeline(tmp_path)
    truth = synthetic.generate_slice(11, nodule=True, size=512)
    params = {"window_center": -600.0, "window_width": 1500.0, "size": (256, 256)}
    expected = synthetic.model_input(truth, params)
    assert set(synthetic.TRANSFER_SYNTAXES) >= {"1.2.840.10008.1.2.5", "1.2.840.10008.1.2.4.90"}
    for ts in synthetic.TRANSFER_SYNTAXES:
        inst = parse(synthetic.to_dicom(truth, transfer_syntax=ts))
        assert inst.transfer_syntax_uid == ts
        pipeline.check(inst)
        out = np.empty(pipeline.input_shape, np.float32)
        assert not pipeline.run(inst, 0, out).lowpass  # the default pipeline decodes JPEG 2000 in full too
        # JPEG-LS near-lossless (NEAR=2) may move each stored value by 2 HU: 2/1500 after the window.
        atol = 2.0 / 1500.0 + 1e-6 if ts == JPEGLSNearLossless else 1e-6
        np.testing.assert_allclose(out, expected, rtol=0, atol=atol, err_msg=ts)


def test_a_modality_lut_for_signed_pixels_maps_from_its_signed_first_value() -> None:
    """Held-out review: a first mapped value of 0xF800 (-2048, stored as US) made every entry LUT Data[0]."""
    from appliance.dicom.pixels import pixel_module
    from appliance.dicom.values import modality_lut_table

    ds = make_dataset(pixels=np.zeros((4, 4), np.int16), PixelRepresentation=1)
    item = Dataset()
    item.add_new(0x00283002, "US", [4096, 0xF800, 16])  # 4096 entries from -2048
    item.add_new(0x00283006, "US", list(range(4096)))
    item.ModalityLUTType = "HU"
    ds.ModalityLUTSequence = [item]
    got = modality_lut_table(ds, pixel_module(ds, "PixelData"))
    assert got is not None
    first, table = got
    assert first == -2048 and table.shape == (4096,)
    np.testing.assert_array_equal(table, np.arange(4096, dtype=np.float32))


@pytest.mark.parametrize("pipeline", ["ct-nodule", "ct-nodule-fast"])
def test_an_unsigned_ct_without_rescale_intercept_is_refused_not_windowed_as_hu(pipeline: str) -> None:
    """Session 18: taken as intercept 0, unsigned CT values (HU + 1024, as most scanners store them) were windowed as
    Hounsfield units, every value 1024 HU too high, and scored. Signed values without one are HU (converters store
    them that way) and pass, as does an enhanced CT whose functional group carries the intercept."""
    p = load_pipeline(REPO / "pipelines" / f"{pipeline}.toml", REPO / "models")
    out = np.zeros((1, 256, 256), np.float32)
    stored = synthetic.stored_values(synthetic.generate_slice(3, size=256))
    unsigned = parse(to_bytes(make_dataset(pixels=stored.astype(np.uint16))))
    with pytest.raises(DicomError, match=r"\(0028,1052\) Rescale Intercept is missing: the stored values of this CT "
                                         r"are unsigned \(\(0028,0103\) Pixel Representation = 0\)"):
        p.run(unsigned, 0, out)
    signed = parse(to_bytes(make_dataset(pixels=(stored.astype(np.int32) - 1024).astype(np.int16))))
    p.run(signed, 0, out)  # HU stored directly: as before
    # held-out review, session 20: HU + 1024 in a signed type (nothing below 0: no air) scored 0.0054 for 0.9998
    shifted = parse(to_bytes(make_dataset(pixels=stored.astype(np.int16))))
    with pytest.raises(DicomError, match=r"\(0028,1052\) Rescale Intercept is missing and no stored value of this CT "
                                         r"is below 0"):
        p.run(shifted, 0, out)
    given = parse(to_bytes(make_dataset(pixels=stored.astype(np.uint16), RescaleSlope=1, RescaleIntercept=-1024)))
    p.run(given, 0, out)


@pytest.mark.parametrize("keyword", ["FloatPixelData", "DoubleFloatPixelData"])
def test_float_pixel_data_in_a_ct_is_refused(keyword: str) -> None:
    """Held-out review, session 20: Float Pixel Data holding HU + 1024 in a CT Image was windowed as HU and scored
    0.0054 for 0.9998. The CT IODs store integers and a rescale; a float CT's unit cannot be known."""
    p = load_pipeline(REPO / "pipelines" / "ct-nodule.toml", REPO / "models")
    stored = synthetic.stored_values(synthetic.generate_slice(3, size=256)).astype(np.float64)
    ds = make_dataset(pixels=stored.astype(np.uint16))
    for kw in ("PixelData", "BitsStored", "HighBit", "PixelRepresentation"):
        delattr(ds, kw)
    ds.BitsAllocated = 32 if keyword == "FloatPixelData" else 64
    setattr(ds, keyword, stored.astype(np.float32 if keyword == "FloatPixelData" else np.float64).tobytes())
    with pytest.raises(DicomError, match=r"Float Pixel Data in a CT image: CT stores integer values"):
        p.run(parse(to_bytes(ds)), 0, np.zeros((1, 256, 256), np.float32))
