"""Drive an Open Inference Protocol server with tritonclient.grpc, as a Triton user would.

Runs in the tritonclient side venv (tests/interop/venvs.py), never in the project's venv. Usage:

    python triton_client_check.py ADDRESS WORKDIR

WORKDIR holds ``tensor.npy`` (FP32 [N, *item_shape]) and ``dicom_*.dcm``. Writes ``WORKDIR/result.json``
(health, metadata, config, statistics, labels) and ``WORKDIR/result.npz`` (output arrays); the pytest side
checks them. Any client error is written to result.json as ``error`` and the exit code is 1.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient


def main(address: str, workdir: Path) -> int:
    result: dict = {}
    arrays: dict[str, np.ndarray] = {}
    try:
        client = grpcclient.InferenceServerClient(url=address)
        result["live"] = client.is_server_live()
        result["ready"] = client.is_server_ready()
        result["model_ready"] = {m: client.is_model_ready(m) for m in ("ct-nodule", "ct-nodule-dicom", "nope")}
        result["server_metadata"] = client.get_server_metadata(as_json=True)
        result["metadata"] = {m: client.get_model_metadata(m, as_json=True) for m in ("ct-nodule", "ct-nodule-dicom")}
        result["config"] = {m: client.get_model_config(m, as_json=True) for m in ("ct-nodule", "ct-nodule-dicom")}

        x = np.load(workdir / "tensor.npy")
        tensor_in = grpcclient.InferInput("image", list(x.shape), "FP32")
        tensor_in.set_data_from_numpy(x)
        outputs = [grpcclient.InferRequestedOutput("prob"), grpcclient.InferRequestedOutput("heatmap")]
        res = client.infer("ct-nodule", [tensor_in], outputs=outputs, request_id="tc-1", priority=1, timeout=5_000_000)
        arrays["tensor_prob"] = res.as_numpy("prob")
        arrays["tensor_heatmap"] = res.as_numpy("heatmap")
        result["tensor_response"] = res.get_response(as_json=True)

        files = sorted(workdir.glob("dicom_*.dcm"))
        blobs = np.array([f.read_bytes() for f in files], dtype=np.object_)
        dicom_in = grpcclient.InferInput("dicom", [len(files)], "BYTES")
        dicom_in.set_data_from_numpy(blobs)
        res = client.infer("ct-nodule-dicom", [dicom_in], request_id="tc-2", client_timeout=30)
        for name in ("prob", "heatmap", "score", "file_index", "frame_index", "lossy"):
            arrays[f"dicom_{name}"] = res.as_numpy(name)
        result["dicom_labels"] = [b.decode() for b in res.as_numpy("label")]

        try:
            client.infer("nope", [tensor_in])
        except grpcclient.InferenceServerException as e:
            result["unknown_model_error"] = {"status": e.status(), "message": e.message()}

        result["statistics"] = client.get_inference_statistics(as_json=True)
        client.close()
    except Exception:  # report to the pytest side, which shows it
        result["error"] = traceback.format_exc()
    (workdir / "result.json").write_text(json.dumps(result, indent=1, default=str))
    np.savez(workdir / "result.npz", **arrays)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
