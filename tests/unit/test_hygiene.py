"""Code hygiene: lint clean, explicit and truthful ``__all__`` in every module."""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import subprocess

import pytest

import appliance
from tests.support import REPO

# modules whose import needs a build-only extra (torch) are checked only when it is installed
BUILD_ONLY = {"appliance.modelbuild.train", "appliance.modelbuild.net"}


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(appliance.__path__, "appliance."):
        if ".proto." in info.name or info.name.endswith(".proto"):
            continue
        names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_all_is_explicit_and_true(name: str) -> None:
    if name in BUILD_ONLY:
        pytest.importorskip("torch")
    module = importlib.import_module(name)
    if name == "appliance" or name.endswith("__main__"):
        return
    exported = getattr(module, "__all__", None)
    if exported is None:
        assert module.__file__ and module.__file__.endswith("__init__.py"), f"{name} has no __all__"
        return
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names missing attributes: {missing}"


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff") or str(REPO / ".venv" / "bin" / "ruff")
    if not shutil.which(ruff):
        pytest.skip("ruff not installed (it is in the dev extra)")
    proc = subprocess.run(
        [ruff, "check", "--output-format", "concise", "appliance", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
