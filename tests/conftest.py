"""Shared fixtures: a tiny fake model repository for the fake engine. Helpers live in ``tests/support.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.manifest import Manifest
from tests.support import write_fake_model


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository holding a fake "ct-nodule" (B=4, 1x256x256, 16x16 map) for the fake engine."""
    d = tmp_path_factory.mktemp("models")
    write_fake_model(d, batch=4, h=256, w=256, name="ct-nodule", heatmap=16)
    return d


@pytest.fixture
def fake_manifest(tmp_path: Path) -> Manifest:
    """A B=4, 1x8x8 manifest whose artifact verifies."""
    return write_fake_model(tmp_path / "models")
