"""The committed gRPC stubs are what the committed .proto generates (run `make proto` after editing it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO

grpc_tools = pytest.importorskip("grpc_tools.protoc")

PROTO = Path("appliance/proto/v1/inference.proto")
GENERATED = ("inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py")


def test_stubs_are_current(tmp_path: Path) -> None:
    (tmp_path / PROTO.parent).mkdir(parents=True)
    shutil.copy(REPO / PROTO, tmp_path / PROTO)
    rc = grpc_tools.main(
        [
            "protoc",
            f"-I{tmp_path}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(tmp_path / PROTO),
        ]
    )
    assert rc == 0
    for name in GENERATED:
        fresh = (tmp_path / PROTO.parent / name).read_text()
        committed = (REPO / PROTO.parent / name).read_text()
        assert fresh == committed, f"{PROTO.parent / name} is stale: run `make proto`"


def test_service_shape() -> None:
    from appliance.proto.v1 import inference_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["Inference"]
    assert service.full_name == "appliance.v1.Inference"
    methods = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert methods == {"Analyze": (False, False), "AnalyzeStream": (True, True), "GetStatus": (False, False)}
