"""appliance.manifest through the schema loader, and the manifest writer (tomli-w) round-tripping through it."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from dicom_testkit import write_manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.errors import ManifestError
from appliance.manifest import DEFAULT_TOLERANCE, load_manifest
from appliance.modelbuild.manifest_writer import dumps
from appliance.modelbuild.manifest_writer import write_manifest as write_toml


def _data(**top: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format_version": 1,
        "name": "m",
        "version": "1.0.0",
        "description": "d",
        "default_precision": "fp32",
        "input": {"name": "image", "shape": [2, 1, 4, 4], "dtype": "float32", "preprocess": {"resize": "area"}},
        "outputs": [{"name": "prob", "shape": [2, 1], "meaning": "p"}],
        "postprocess": {"threshold": 0.5, "labels": ["no", "yes"]},
        "artifacts": {"fp32": {"file": "m.onnx", "precision": "fp32", "sha256": "ab" * 32, "bytes": 3,
                               "session_config": {"session.x": "1"}, "build": {"seed": 1}}},
        "metrics": {"fp32": {"auc": 0.9}},
    }
    data.update(top)
    return data


TRICKY = "tab\there, \"quotes\", 'single', back\\slash, new\nline, cr\r, nul-ish \x01, non-ASCII: Größe µm 肺 🫁"


def test_writer_round_trips_tricky_strings_through_load_manifest(tmp_path: Path) -> None:
    path = tmp_path / "model.toml"
    data = _data(name=TRICKY, description=TRICKY)
    data["artifacts"]["fp32"]["build"]["command"] = TRICKY
    data["artifacts"]["fp32"]["session_config"] = {'key "with" . dots\t': TRICKY}
    write_toml(path, data, header="a header\nwith two lines")
    manifest = load_manifest(path)
    assert manifest.name == TRICKY
    assert manifest.description == TRICKY
    assert manifest.artifact().build["command"] == TRICKY
    assert manifest.artifact().session_config == {'key "with" . dots\t': TRICKY}
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# a header\n# with two lines\n")


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(exclude_categories=("Cs",)), max_size=40))
def test_any_text_round_trips(tmp_path: Path, text: str) -> None:
    data = _data(description=text, version=text or "v")
    assert tomllib.loads(dumps(data)) == data
    path = tmp_path / "model.toml"
    write_toml(path, data)
    assert load_manifest(path).description == text


def test_writer_rounds_floats_to_six_digits_and_keeps_booleans() -> None:
    out = tomllib.loads(dumps({"a": 0.123456789, "b": True, "c": [1.0000001, 2], "d": {"e": 1e-12}}))
    assert out == {"a": 0.123457, "b": True, "c": [1.0, 2], "d": {"e": 1e-12}}


def test_valid_manifest_loads_typed(tmp_path: Path) -> None:
    path = tmp_path / "model.toml"
    write_toml(path, _data())
    m = load_manifest(path)
    assert m.input.shape == (2, 1, 4, 4) and m.input.batch_size == 2
    assert m.outputs[0].shape == (2, 1)
    art = m.artifact()
    assert art.path == (tmp_path / "m.onnx").resolve()
    assert art.size_bytes == 3 and art.block_size is None and art.tolerance == DEFAULT_TOLERANCE
    assert m.postprocess == {"threshold": 0.5, "labels": ["no", "yes"]}


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    table: Any = data
    for p in parents:
        table = table[int(p)] if p.isdigit() else table[p]
    table[last] = value


@pytest.mark.parametrize(
    ("dotted", "value", "needles"),
    [
        ("format_version", 2, ["key format_version", "expected one of 1, got 2"]),
        ("colour", "x", ["key colour: unknown key", "known: artifacts, default_precision"]),
        ("input.shape", [2, 1, 4], ["key input.shape", "length >= 4"]),
        ("input.shape", [2, 0, 4, 4], ["key input.shape[1]", ">= 1", "got 0"]),
        ("input.layout", "NCHW", ["key input.layout: unknown key", "known: dtype, name, preprocess, shape"]),
        ("outputs.0.shape", [3, 1], ["key outputs[0].shape", "first dimension 3 != batch size 2"]),
        ("outputs.0.meaning", 3, ["key outputs[0].meaning", "expected str, got int 3"]),
        ("artifacts.fp32.bytes", "3", ["key artifacts.fp32.bytes", "expected int, got str '3'"]),
        ("artifacts.fp32.sha256", "abc", ["key artifacts.fp32.sha256", "expected str matching"]),
        ("artifacts.fp32.tolerance", -1.0, ["key artifacts.fp32.tolerance", ">= 0.0", "got -1.0"]),
        ("artifacts.fp32.sha265", "x", ["key artifacts.fp32.sha265: unknown key", "known: block_size, build"]),
        ("artifacts.fp32.extra", {"a": 1}, ["key artifacts.fp32.extra: unknown table [artifacts.fp32.extra]"]),
        ("artifacts.fp32.session_config", {"session.x": 1},
         ['key artifacts.fp32.session_config."session.x"', "expected str, got int 1"]),
        ("default_precision", "int4", ["key default_precision", "'int4' has no artifact"]),
        ("artifacts", {}, ["key artifacts", "length >= 1"]),
    ],
)
def test_manifest_errors_name_file_and_key_path(tmp_path: Path, dotted: str, value: Any, needles: list[str]) -> None:
    data = _data()
    _set(data, dotted, value)
    path = tmp_path / "model.toml"
    write_toml(path, data)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    message = str(info.value)
    assert f"model manifest {path.resolve()}: " in message
    for needle in needles:
        assert needle in message, message


def test_missing_required_key_is_named(tmp_path: Path) -> None:
    data = _data()
    del data["input"]["dtype"]
    path = tmp_path / "model.toml"
    write_toml(path, data)
    with pytest.raises(ManifestError, match=r"key input\.dtype: missing \(required\)"):
        load_manifest(path)


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (lambda p: None, "not found"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b"name = \"\xff\"\n"), "is not UTF-8 text"),
        (lambda p: p.write_text("name = \n"), "is not valid TOML"),
    ],
)
def test_file_errors_are_named(tmp_path: Path, setup: Any, needle: str) -> None:
    path = tmp_path / "model.toml"
    setup(path)
    with pytest.raises(ManifestError, match=needle) as info:
        load_manifest(path)
    assert str(path) in str(info.value)


def test_testkit_manifest_still_loads(tmp_path: Path) -> None:
    m = load_manifest(write_manifest(tmp_path / "models"))
    assert m.input.batch_size == 8
