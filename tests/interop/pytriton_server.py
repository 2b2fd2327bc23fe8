"""A real Triton Inference Server (PyTriton's bundled tritonserver) serving an ONNX model through onnxruntime.

Runs in the PyTriton side venv (tests/interop/venvs.py) with the venv's libpython first on LD_LIBRARY_PATH.
Usage:

    python pytriton_server.py MODEL.onnx MODEL_NAME GRPC_PORT HTTP_PORT METRICS_PORT WORKSPACE [KEY=VALUE ...]

WORKSPACE must not exist yet (PyTriton creates it). KEY=VALUE pairs are onnxruntime session config entries
(the manifest artifact's ``session_config``, so both sides run the same kernels).

The model's batch dimension is fixed (B); Triton's dynamic batcher may hand the callable fewer rows, which it
pads to B (Triton never pads, docs/scale-out.md) and crops again. Serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import signal
import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def main(
    onnx_path: str, model_name: str, grpc_port: int, http_port: int, metrics_port: int, workspace: str, *entries: str
) -> None:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    for entry in entries:
        key, _, value = entry.partition("=")
        options.add_session_config_entry(key, value)
    session = ort.InferenceSession(onnx_path, sess_options=options, providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    b, item_shape = int(inp.shape[0]), tuple(int(d) for d in inp.shape[1:])
    outputs = session.get_outputs()

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        x = inputs[inp.name].astype(np.float32, copy=False)
        n = len(x)
        padded = np.zeros((b, *item_shape), dtype=np.float32)
        padded[:n] = x
        values = session.run([o.name for o in outputs], {inp.name: padded})
        return {o.name: v[:n] for o, v in zip(outputs, values, strict=True)}

    config = TritonConfig(
        grpc_address="127.0.0.1",
        grpc_port=grpc_port,
        http_address="127.0.0.1",
        http_port=http_port,
        metrics_port=metrics_port,
        allow_gpu_metrics=False,
        exit_timeout_secs=5,
    )
    with Triton(config=config, workspace=workspace) as triton:
        triton.bind(
            model_name=model_name,
            infer_func=infer,
            inputs=[Tensor(name=inp.name, dtype=np.float32, shape=item_shape)],
            outputs=[Tensor(name=o.name, dtype=np.float32, shape=tuple(int(d) for d in o.shape[1:])) for o in outputs],
            config=ModelConfig(max_batch_size=b),
            strict=True,
        )
        signal.signal(signal.SIGTERM, lambda *_: triton.stop())
        print("pytriton: serving", flush=True)
        triton.serve()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), a[5], *a[6:])
