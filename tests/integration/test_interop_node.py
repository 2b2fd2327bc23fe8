"""An independent client stays green: Node's @grpc/grpc-js + @grpc/proto-loader against `appliance serve`.

tests/interop/node pins the packages (package-lock.json; CI runs `npm ci` via `make interop`, and this test
runs it when node_modules is missing). Skips only where Node itself is missing.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pydicom
import pytest

from appliance.tools import synthetic
from tests.interop.daemon import appliance_serve
from tests.support import REPO

NODE_DIR = REPO / "tests" / "interop" / "node"
PRE = {"window_center": -600.0, "window_width": 1500.0, "size": (256, 256)}


@pytest.fixture(scope="module")
def node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed (apt-get install nodejs npm)")
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        npm = shutil.which("npm")
        assert npm is not None, "node is installed but npm is not: cannot install tests/interop/node"
        proc = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    return node


@pytest.fixture(scope="module")
def daemon_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `appliance serve` (fake engine) on a free loopback port; yields its address."""
    with appliance_serve(tmp_path_factory.mktemp("node-daemon")) as target:
        yield target


def test_node_grpc_js_health_and_analyze(node: str, daemon_target: str, tmp_path: Path) -> None:
    truth = synthetic.generate_slice(41, nodule=True, size=512)
    dicom = synthetic.to_dicom(truth)
    (tmp_path / "slice.dcm").write_bytes(dicom)
    proc = subprocess.run(
        [node, str(NODE_DIR / "client.js"), daemon_target, str(REPO), str(tmp_path / "slice.dcm")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["health"][""] == "SERVING"
    assert out["health"]["appliance.v1.Inference"] == "SERVING"
    assert out["health"]["no.such.Service"]["code"] == grpc.StatusCode.NOT_FOUND.value[0]

    reply = out["analyze"]
    assert reply["request_id"] == "node-1"
    assert reply["sop_instance_uid"] == pydicom.dcmread(io.BytesIO(dicom)).SOPInstanceUID
    assert reply["model"]["name"] == "ct-nodule" and reply["model"]["backend"] == "fake"
    (frame,) = reply["frames"]
    expected = float(synthetic.model_input(truth, PRE).mean())  # the fake engine's score: mean model input
    nodule = next(f["score"] for f in frame["findings"] if f["label"] == "nodule")
    assert nodule == pytest.approx(expected, abs=1e-5)

    bad = out["bad"]
    assert bad["code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0], bad
    assert "DICOM" in bad["details"] and bad["rich"]
