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
    example = Path(__file__).resolve().parent.parent / "systemd" / "appliance.toml.example"
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
