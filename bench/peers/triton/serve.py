"""The Triton peer: PyTriton's bundled Triton serving the appliance's model with the appliance's preprocessing.

Runs in the peer venv (``bench/peers/triton/setup.sh``), never in the appliance's. What a careful Triton user
would build for the same job:

* one model ``ct-nodule`` with a BYTES input ``dicom`` (one Part-10 file per request) and outputs ``prob`` [1]
  and ``heatmap`` [16, 16];
* Triton's dynamic batcher with ``max_batch_size`` = B from the manifest and a chosen
  ``max_queue_delay_microseconds``; ``--instances`` model instances (PyTriton runs each as a thread of this
  process, fed by Triton's Python-backend stub);
* in each instance: the appliance's own DICOM parse and pipeline (``appliance.dicom.parse``,
  ``Pipeline.check``/``run`` imported from the checkout on ``PYTHONPATH``) writing into that instance's
  preallocated B-slot batch, padded with zeros (the INT4 ONNX has a literal batch B; Triton never pads,
  docs/performance.md), then ONNX Runtime CPU with the appliance's session settings (ORT_ENABLE_ALL,
  SEQUENTIAL, inter 1, intra ``--intra-op-threads``, the manifest's session config entries).

Usage (the bench starts it; by hand)::

    PYTHONPATH=. bench/peers/triton/.venv/bin/python bench/peers/triton/serve.py --grpc-port 8001 \
        --instances 2 --queue-delay-us 10000
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import sysconfig
import threading
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
MODEL_NAME = "ct-nodule"


def _fix_libpython() -> None:
    """Put this interpreter's libpython first for Triton's Python-backend stub (docs/performance.md).

    Without it the stub loads the distro's libpython while the stdlib is this interpreter's, and model load
    fails with ``'_thread.RLock' object has no attribute '_recursion_count'``.
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    current = os.environ.get("LD_LIBRARY_PATH", "")
    if libdir and not current.startswith(libdir):
        os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{current}" if current else libdir


class Instance:
    """One model instance: its own ORT session and its own B-slot batch buffer."""

    def __init__(self, manifest, pipeline, precision: str | None, intra_op_threads: int) -> None:
        import onnxruntime as ort

        self.pipeline = pipeline
        art = manifest.artifact(precision)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.intra_op_num_threads = intra_op_threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        for key, value in art.session_config.items():
            so.add_session_config_entry(key, value)
        self.session = ort.InferenceSession(str(art.path), sess_options=so, providers=["CPUExecutionProvider"])
        self.input_name = manifest.input.name
        self.batch = int(manifest.input.shape[0])
        self.buffer = np.zeros(tuple(manifest.input.shape), dtype=np.float32)
        self.output_names = [o.name for o in manifest.outputs]
        self.lock = threading.Lock()

    def __call__(self, requests):
        """PyTriton callable (no @batch: Triton hands us the requests it gathered, at most B)."""
        from appliance.dicom import parse

        with self.lock:
            n = len(requests)
            self.buffer[n:] = 0.0
            for i, req in enumerate(requests):
                data = req["dicom"].reshape(-1)[0]
                inst = parse(bytes(data))
                self.pipeline.check(inst)
                self.pipeline.run(inst, 0, self.buffer[i])
            values = self.session.run(self.output_names, {self.input_name: self.buffer})
            out = dict(zip(self.output_names, values, strict=True))
            return [
                {"prob": out["prob"][i : i + 1].reshape(1, 1).astype(np.float32),
                 "heatmap": out["heatmap"][i : i + 1].astype(np.float32)}
                for i in range(n)
            ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--queue-delay-us", type=int, default=1000)
    parser.add_argument("--intra-op-threads", type=int, default=1)
    parser.add_argument("--models-dir", type=Path, default=REPO / "models")
    parser.add_argument("--pipeline", type=Path, default=REPO / "pipelines" / "ct-nodule.toml")
    parser.add_argument("--precision", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _fix_libpython()

    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    from appliance.manifest import load_manifest
    from appliance.pipeline.loader import load_pipeline

    pipeline = load_pipeline(args.pipeline, args.models_dir)
    manifest = load_manifest(args.models_dir / pipeline.model / "model.toml")
    batch = int(manifest.input.shape[0])
    instances = [Instance(manifest, pipeline, args.precision, args.intra_op_threads) for _ in range(args.instances)]
    config = TritonConfig(grpc_port=args.grpc_port, http_port=args.http_port, metrics_port=args.metrics_port,
                          log_verbose=0, exit_timeout_secs=5)
    hm = next(o for o in manifest.outputs if o.name == "heatmap").shape[1:]
    with Triton(config=config) as triton:
        triton.bind(
            model_name=MODEL_NAME,
            infer_func=instances,
            inputs=[Tensor(name="dicom", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="prob", dtype=np.float32, shape=(1,)),
                     Tensor(name="heatmap", dtype=np.float32, shape=tuple(hm))],
            config=ModelConfig(
                max_batch_size=batch,
                batcher=DynamicBatcher(max_queue_delay_microseconds=args.queue_delay_us),
            ),
            strict=False,
        )
        signal.signal(signal.SIGTERM, lambda *_: triton.stop())
        print(f"triton peer: grpc {args.grpc_port}, {args.instances} instance(s), "
              f"queue delay {args.queue_delay_us} us, B={batch}", flush=True)
        triton.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
