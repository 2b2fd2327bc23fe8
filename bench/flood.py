"""One client floods slow bombs while another sends valid slices: how long the valid ones wait.

    python bench/flood.py [CHECKOUT=.] [BOMBS=12] [VALID=5]

Starts ``appliance serve`` from CHECKOUT with test fault injection (``APPLIANCE_TEST_DECODER_FAULTS=1``) and
``workers.step_timeout_s = 2``, waits until its health check says SERVING, then sends BOMBS "spin" inputs (each
holds a worker for its whole 2 s budget) on one gRPC connection and, half a second later, VALID 512x512 slices one
after another on a second connection. Prints each valid slice's latency and status. docs/robustness.md ("One
sender cannot starve the others") quotes it.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.tools import synthetic
from appliance.tools.chaos import fault_case
from appliance.tools.procs import free_port, stop_process, wait_serving

OWN = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own per channel: a separate peer


def _call(channel: grpc.Channel, data: bytes) -> tuple[float, str]:
    t0 = time.monotonic()
    try:
        pb_grpc.InferenceStub(channel).Analyze(pb.AnalyzeRequest(dicom=data), timeout=30)
        code = "OK"
    except grpc.RpcError as e:
        code = e.code().name
    return time.monotonic() - t0, code


def main(argv: list[str]) -> int:
    repo = Path(argv[1] if len(argv) > 1 else ".").resolve()
    n_bombs = int(argv[2]) if len(argv) > 2 else 12
    n_valid = int(argv[3]) if len(argv) > 3 else 5
    target = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "flood.toml"
        cfg.write_text(f'[server]\nlisten = ["{target}"]\n[workers]\nstep_timeout_s = 2.0\n[thermal]\nsensor = "none"\n'
                       '[metrics]\nlisten = "127.0.0.1:0"\n')
        env = dict(os.environ, APPLIANCE_TEST_DECODER_FAULTS="1")
        daemon = subprocess.Popen([sys.executable, "-m", "appliance.cli", "serve", "--config", str(cfg)], cwd=repo,
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_serving(target, proc=daemon)
            valid = synthetic.to_dicom(synthetic.generate_slice(5, size=512))
            spin = fault_case("spin").data
            with grpc.insecure_channel(target, options=OWN) as flooder, \
                    grpc.insecure_channel(target, options=OWN) as other, \
                    concurrent.futures.ThreadPoolExecutor(n_bombs) as pool:
                bombs = [pool.submit(_call, flooder, spin) for _ in range(n_bombs)]
                time.sleep(0.5)
                latencies = [_call(other, valid) for _ in range(n_valid)]
                finished = [b.result() for b in bombs]
        finally:
            stop_process(daemon)
    print("valid slices:", " ".join(f"{t:.2f} s {code}" for t, code in latencies))
    last = max(t for t, _ in finished)
    print(f"bombs: {sorted({code for _, code in finished})}, the last answered after {last:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
