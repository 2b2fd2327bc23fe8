"""Config: defaults are the embedded default; errors name the key; unknown keys are errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.config import load_config
from appliance.errors import ConfigError


def test_defaults_are_the_embedded_default() -> None:
    cfg = load_config()
    assert cfg.engine.backend == "auto"
    assert cfg.model.name == "ct-nodule"
    assert "127.0.0.1:50051" in cfg.server.listen
    assert any(a.startswith("unix:") for a in cfg.server.listen)
    assert cfg.server.max_message_bytes == 64 << 20
    assert cfg.thermal.sensor == "auto"
    assert (cfg.models_dir() / "ct-nodule").is_dir()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[batcher]\nmax_wiat_s = 1\n", "batcher.max_wiat_s"),
        ("[engine]\nintra_op_threads = 'two'\n", "engine.intra_op_threads"),
        ("[servre]\n", "[servre]"),
        ("[batcher]\nqueue_capacity = 0\n", "batcher.queue_capacity"),
        ("[thermal]\nsensor = 'ir-camera'\n", "thermal.sensor"),
        ("[server]\nlisten = '127.0.0.1:1'\n", "server.listen"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "appliance.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        load_config(path)


def test_example_config_loads() -> None:
    example = Path(__file__).resolve().parents[2] / "systemd" / "appliance.toml.example"
    cfg = load_config(example)
    assert cfg.server.grace_s > 0


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.toml"):
        load_config(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[server]\ndefault_deadline_s = '5'\n", "server.default_deadline_s"),
        ("[batcher]\nmax_wait_s = true\n", "batcher.max_wait_s"),
        ("[server]\ngrace_s = nan\n", "server.grace_s"),
        ("[server]\ndefault_deadline_s = -1.0\n", "server.default_deadline_s"),
    ],
)
def test_numbers_must_be_numbers(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "appliance.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=key):
        load_config(path)


def _scalar_keys(obj: object, prefix: str = "") -> dict[str, object]:
    """Every key of the config's schema tables (nested ones included) with its value."""
    import msgspec

    from appliance.schema import Schema

    keys: dict[str, object] = {}
    for f in msgspec.structs.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, Schema) and f.name != "options":
            keys.update(_scalar_keys(value, f"{prefix}{f.encode_name}."))
        else:
            keys[f"{prefix}{f.encode_name}"] = value
    return keys


def test_every_numeric_key_has_a_documented_range() -> None:
    from appliance.config import RANGES, Config

    docs = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    keys = _scalar_keys(Config())
    for key, value in keys.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            assert key in RANGES, f"{key} has no range in appliance.config.RANGES"
            assert f"`{key}`" in docs, f"{key} is not in docs/operations.md's range table"
    for key, (lo, hi) in RANGES.items():
        assert lo <= keys[key] <= hi, key  # type: ignore[operator]
    assert "thermal.sim.ambient_c" in RANGES and "server.inflight_bytes" in RANGES


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("dicom", "max_decoded_bytes", -1),
        ("dicom", "max_pixels_per_frame", 0),
        ("server", "max_message_bytes", 1 << 31),
        ("batcher", "preprocess_workers", 100000),
        ("batcher", "max_wait_s", 1e9),
        ("server", "grace_s", 60.0),
        ("metrics", "listen", "127.0.0.1:99999"),
        ("server", "listen", ["127.0.0.1:99999"]),
        ("server", "listen", ["10.0.0.5:50051"]),
        ("access", "loopback", "everyone"),
        ("logging", "level", "verbose"),
    ],
)
def test_out_of_range_values_name_the_key(section: str, key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"{section}.{key}"):
        load_config(None, {section: {key: value}})


def test_unknown_engine_option_is_refused_for_the_selected_backend() -> None:
    from appliance.engines.fake import FakeOptions

    cfg = load_config(None, {"engine": {"backend": "fake", "options": {"latency_s": 0.01}}})
    assert cfg.engine.options == FakeOptions(latency_s=0.01)
    with pytest.raises(ConfigError, match="engine.options.latency: .*'fake' .*known: dead_after, fail_batches"):
        load_config(None, {"engine": {"backend": "fake", "options": {"latency": 0.01}}})
    with pytest.raises(ConfigError, match="engine.options.latency_s: .*'onnxruntime-cpu' .*known: none"):
        load_config(None, {"engine": {"backend": "onnxruntime-cpu", "options": {"latency_s": 0.01}}})
