"""The committed gRPC stubs are what the committed .proto files generate (run `make proto` after editing one)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import REPO

grpc_tools = pytest.importorskip("grpc_tools.protoc")

PROTOS = {
    Path("appliance/proto/v1/inference.proto"): ("inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py"),
    Path("appliance/proto/inference/grpc_service.proto"): (
        "grpc_service_pb2.py",
        "grpc_service_pb2.pyi",
        "grpc_service_pb2_grpc.py",
    ),
}


@pytest.mark.parametrize("proto", sorted(PROTOS), ids=str)
def test_stubs_are_current(tmp_path: Path, proto: Path) -> None:
    (tmp_path / proto.parent).mkdir(parents=True)
    shutil.copy(REPO / proto, tmp_path / proto)
    rc = grpc_tools.main(
        [
            "protoc",
            f"-I{tmp_path}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(tmp_path / proto),
        ]
    )
    assert rc == 0
    for name in PROTOS[proto]:
        fresh = (tmp_path / proto.parent / name).read_text()
        committed = (REPO / proto.parent / name).read_text()
        assert fresh == committed, f"{proto.parent / name} is stale: run `make proto`"


def test_service_shape() -> None:
    from appliance.proto.v1 import inference_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["Inference"]
    assert service.full_name == "appliance.v1.Inference"
    methods = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert methods == {"Analyze": (False, False), "AnalyzeStream": (True, True), "GetStatus": (False, False)}


# Triton's field numbers (common/protobuf/grpc_service.proto, model_config.proto): a client built from Triton's
# stubs decodes our messages only if these match exactly.
TRITON_FIELDS = {
    "ModelInferRequest": {
        "model_name": 1,
        "model_version": 2,
        "id": 3,
        "parameters": 4,
        "inputs": 5,
        "outputs": 6,
        "raw_input_contents": 7,
    },
    "ModelInferResponse": {
        "model_name": 1,
        "model_version": 2,
        "id": 3,
        "parameters": 4,
        "outputs": 5,
        "raw_output_contents": 6,
    },
    "InferParameter": {"bool_param": 1, "int64_param": 2, "string_param": 3, "double_param": 4, "uint64_param": 5},
    "ModelMetadataResponse": {"name": 1, "versions": 2, "platform": 3, "inputs": 4, "outputs": 5},
    "ModelConfig": {
        "name": 1,
        "platform": 2,
        "backend": 17,
        "max_batch_size": 4,
        "input": 5,
        "output": 6,
        "dynamic_batching": 11,
        "instance_group": 7,
        "parameters": 14,
    },
    "ModelInput": {"name": 1, "data_type": 2, "format": 3, "dims": 4, "optional": 8},
    "ModelOutput": {"name": 1, "data_type": 2, "dims": 3, "label_filename": 4},
    "ModelDynamicBatching": {
        "preferred_batch_size": 1,
        "max_queue_delay_microseconds": 2,
        "preserve_ordering": 3,
        "priority_levels": 4,
        "default_priority_level": 5,
        "default_queue_policy": 6,
        "priority_queue_policy": 7,
    },
    "ModelStatistics": {
        "name": 1,
        "version": 2,
        "last_inference": 3,
        "inference_count": 4,
        "execution_count": 5,
        "inference_stats": 6,
        "batch_stats": 7,
    },
    "InferStatistics": {
        "success": 1,
        "fail": 2,
        "queue": 3,
        "compute_input": 4,
        "compute_infer": 5,
        "compute_output": 6,
        "cache_hit": 7,
        "cache_miss": 8,
    },
}


def test_open_inference_protocol_is_triton_compatible() -> None:
    from appliance.proto.inference import grpc_service_pb2 as oip

    service = oip.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == "inference.GRPCInferenceService"
    assert {m.name for m in service.methods} == {
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelConfig",
        "ModelStatistics",
    }
    assert all(not m.client_streaming and not m.server_streaming for m in service.methods)
    for message, fields in TRITON_FIELDS.items():
        descriptor = oip.DESCRIPTOR.message_types_by_name[message]
        assert {f.name: f.number for f in descriptor.fields if f.name in fields} == fields, message
    assert oip.DataType.Value("TYPE_FP32") == 11 and oip.DataType.Value("TYPE_STRING") == 13
