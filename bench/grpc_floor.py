"""The gRPC floor: CPU per request of a bare ``grpc.aio`` server that receives the workload and answers at once.

    python bench/grpc_floor.py [WORKLOAD=quarters] [SECONDS=8] [HEAP_KEEP_BYTES=64 MiB]

The same proto, message sizes and client load (16 closed-loop clients, ``appliance.tools.loadgen``) as the bench,
with no work behind the handler: what any Python gRPC front door costs before it does anything. docs/performance.md
(section 5) compares it with the daemon's event loop, gRPC core and supervisor threads. The server process keeps
its heap as the daemon does (``appliance.heap``; 0 = glibc's defaults).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import sys
from typing import Any

import grpc

from appliance.heap import keep_heap
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.tools import benchcost, loadgen, synthetic
from appliance.tools.procs import free_port

_REPLY = pb.AnalyzeResponse(request_id="x", frames=[
    pb.FrameResult(frame_index=0, findings=[pb.Finding(label="nodule", score=0.5)])])


class _Bare(pb_grpc.InferenceServicer):
    async def Analyze(self, request: pb.AnalyzeRequest, context: Any) -> pb.AnalyzeResponse:  # noqa: N802
        return _REPLY


def _serve(port: int, ready: Any, keep: int) -> None:
    keep_heap(keep)

    async def main() -> None:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 1 << 30)])
        pb_grpc.add_InferenceServicer_to_server(_Bare(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


def main(argv: list[str]) -> int:
    workload = argv[1] if len(argv) > 1 else "quarters"
    seconds = float(argv[2]) if len(argv) > 2 else 8.0
    keep = int(argv[3]) if len(argv) > 3 else 64 << 20
    port = free_port()
    ready = mp.Event()
    proc = mp.Process(target=_serve, args=(port, ready, keep), daemon=True)
    proc.start()
    ready.wait(30)
    files = synthetic.workload(workload, 64, 7)

    async def drive() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=loadgen.CHANNEL_OPTIONS) as ch:
            send = loadgen.appliance_sender(ch, files)
            await loadgen.closed_loop(send, len(files), concurrency=16, duration_s=2)  # warm-up
            pid = proc.pid or 0
            c0 = benchcost.proc_tree_cpu_s(pid)[pid]
            res = await loadgen.closed_loop(send, len(files), concurrency=16, duration_s=seconds)
            cpu = benchcost.proc_tree_cpu_s(pid)[pid] - c0
            n = len(res.latencies)
            print(f"bare grpc.aio server, {workload}, heap_keep_bytes {keep}: {n / res.elapsed_s:.0f} req/s, "
                  f"server CPU {cpu / n * 1000:.3f} ms per request")

    try:
        asyncio.run(drive())
    finally:
        proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
