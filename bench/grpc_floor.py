"""The gRPC floor: CPU per request of a bare ``grpc.aio`` server that receives the workload and answers at once.

    python bench/grpc_floor.py [WORKLOAD=quarters] [SECONDS=8] [HEAP_KEEP_BYTES=64 MiB] [HOPS=0]

The same proto, message sizes and client load (16 closed-loop clients, ``appliance.tools.loadgen``) as the bench,
with no work behind the handler: what any Python gRPC front door costs before it does anything. docs/performance.md
(section 5) compares it with the daemon's event loop, gRPC core and supervisor threads. The server process keeps
its heap as the daemon does (``appliance.heap``; 0 = glibc's defaults).

``HOPS`` adds the daemon's thread hand-offs, still with no work: 1 = the reply waits for a future that another
thread resolves with ``call_soon_threadsafe`` (the engine thread answering), 2 = that thread first runs a
coroutine on the loop and waits for it (a supervisor's admission, ``run_coroutine_threadsafe``), 3 = the handler
waits under ``wait_for(shield(...))`` (the deadline wait).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import sys
import threading
from typing import Any

import grpc

from appliance.heap import keep_heap
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.tools import benchcost, loadgen, synthetic
from appliance.tools.procs import free_port

_REPLY = pb.AnalyzeResponse(request_id="x", frames=[
    pb.FrameResult(frame_index=0, findings=[pb.Finding(label="nodule", score=0.5)])])


async def _admitted() -> bool:
    return True


def _hand_off(jobs: queue.Queue[tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]], hops: int) -> None:
    while True:
        loop, future = jobs.get()
        if hops >= 2:
            asyncio.run_coroutine_threadsafe(_admitted(), loop).result()
        loop.call_soon_threadsafe(lambda f=future: f.done() or f.set_result(True))


class _Bare(pb_grpc.InferenceServicer):
    def __init__(self, hops: int) -> None:
        self.hops = hops
        self.jobs: queue.Queue[tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]] = queue.Queue()
        for _ in range(2 if hops else 0):
            threading.Thread(target=_hand_off, args=(self.jobs, hops), daemon=True).start()

    async def Analyze(self, request: pb.AnalyzeRequest, context: Any) -> pb.AnalyzeResponse:  # noqa: N802
        if self.hops:
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            self.jobs.put((loop, future))
            if self.hops >= 3:
                await asyncio.wait_for(asyncio.shield(future), timeout=30)
            else:
                await future
        return _REPLY


def _serve(port: int, ready: Any, keep: int, hops: int) -> None:
    keep_heap(keep)

    async def main() -> None:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 1 << 30)])
        pb_grpc.add_InferenceServicer_to_server(_Bare(hops), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


def main(argv: list[str]) -> int:
    workload = argv[1] if len(argv) > 1 else "quarters"
    seconds = float(argv[2]) if len(argv) > 2 else 8.0
    keep = int(argv[3]) if len(argv) > 3 else 64 << 20
    hops = int(argv[4]) if len(argv) > 4 else 0
    port = free_port()
    ready = mp.Event()
    proc = mp.Process(target=_serve, args=(port, ready, keep, hops), daemon=True)
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
            print(f"bare grpc.aio server, {workload}, heap_keep_bytes {keep}, hops {hops}: "
                  f"{n / res.elapsed_s:.0f} req/s, server CPU {cpu / n * 1000:.3f} ms per request")

    try:
        asyncio.run(drive())
    finally:
        proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
