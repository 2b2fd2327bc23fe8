"""The extended ``appliance bench`` run: costs, load patterns on the appliance and its peer, ratios, targets.

Order of one run (docs/performance.md): per-slice costs on one pinned core while nothing is loaded; start the
appliance (and tune, then start, the Triton peer); closed-loop sweep, Poisson, bursts, each pattern on both
servers back to back, alternating which goes first; stop both; the costs again (the ceilings use the mean of the
two cost phases); the overlap-vs-sequential comparisons; targets; plots. Every server figure also carries the
CPU seconds, context switches and minor page faults of the server's whole process tree per answered request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.tools import benchcost as bc
from appliance.tools import benchreport, loadgen
from appliance.tools.benchreport import ratio

__all__ = ["run_extended"]

REPO = Path(__file__).resolve().parents[2]

#: Reads a server's GetStatus fields (appliance.tools.bench.status_fields), for the peers that have one.
_StatusCall = Callable[[], Awaitable[dict[str, Any]]]


@dataclass
class _Server:
    name: str  # "appliance" or "triton"
    target: str
    pid: int | None
    metrics_port: int | None = None  # Triton's Prometheus port: batch sizes and queue time
    batch: int = 8
    raw: dict[str, list[float]] = field(default_factory=dict)  # pattern -> latencies (ms), for the plots
    scores: dict[int, float] = field(default_factory=dict)  # file index -> score


def _load_model(args: argparse.Namespace) -> tuple[Any, Any]:
    from appliance.manifest import load_manifest
    from appliance.pipeline.loader import load_pipeline

    name = args.pipeline or "ct-nodule"
    pipeline = load_pipeline(REPO / "pipelines" / f"{name}.toml", REPO / "models")
    return pipeline, load_manifest(REPO / "models" / pipeline.model / "model.toml")


def _costs(args: argparse.Namespace, files: list[bytes], pipeline: Any, manifest: Any) -> dict[str, Any]:
    """Per-slice CPU costs on one pinned core, the ceilings, engine_flops_ratio, uncompressed preprocessing."""
    from appliance.tools import synthetic

    batch = int(manifest.input.shape[0])
    native = synthetic.workload("native", 16, args.seed + 1)
    with bc.pinned() as cpu:
        pre = bc.preprocess_costs(files, pipeline)
        pre_native = bc.preprocess_costs(native, pipeline, reps=7)
        engine_ms = bc.engine_cost(manifest)
        sgemm = bc.sgemm_gflops()
    flops = bc.model_flops(manifest.artifact().path)
    cores = len(os.sched_getaffinity(0))
    workers = args.workers or max(1, cores - 1)
    engine_gflops = flops / (engine_ms / 1000.0) / 1e9
    floor = np.asarray(pre["per_file_ms"]) + engine_ms  # no queueing: own preprocessing + one engine batch
    return {
        "costs": {
            "cpu": cpu,
            "latency_floor_ms": {"p50": round(float(np.percentile(floor, 50)), 2),
                                 "p99": round(float(np.percentile(floor, 99)), 2),
                                 "jitter": round(float(np.percentile(floor, 99) / np.percentile(floor, 50)), 3)},
            "preprocess": pre,
            "preprocess_uncompressed": {k: v for k, v in pre_native.items() if k != "per_file_ms"},
            "engine_batch_ms": round(engine_ms, 3),
            "batch_size": batch,
            "engine_per_slice_ms": round(engine_ms / batch, 3),
            "model_gflop_per_batch": round(flops / 1e9, 4),
            "engine_gflops": round(engine_gflops, 2),
            "sgemm_1thread_gflops": round(sgemm, 2),
        },
        "ceiling": {"cores": cores, "workers": workers,
                    **bc.ceilings(pre["mean_ms"], engine_ms, batch, cores, workers)},
        "engine_flops_ratio": round(engine_gflops / sgemm, 3),
        "preprocess_uncompressed_ms": pre_native["median_ms"],
    }


async def _point(srv: _Server, pattern: str, send: loadgen.Sender,
                 run: Callable[[loadgen.Sender], Awaitable[Any]], status: _StatusCall | None = None) -> dict[str, Any]:
    """Run one pattern on one server; add CPU and wake-ups per answered request (whole process tree)."""
    cpu0 = bc.proc_tree_cpu_s(srv.pid) if srv.pid else {}
    names = bc.python_thread_names(srv.pid) if srv.pid else {}
    thr0 = bc.thread_cpu_s(srv.pid, names) if srv.pid else {}
    sw0 = bc.proc_tree_switches(srv.pid) if srv.pid else 0
    pf0 = bc.proc_tree_minor_faults(srv.pid) if srv.pid else 0
    m0 = _triton_metrics(srv)
    s0 = await _status(status)
    got = await run(send)
    res, extra = got if isinstance(got, tuple) else (got, None)
    out: dict[str, Any] = res.summary()
    ok = len(res.latencies)
    if srv.pid and ok:
        cpu = bc.cpu_delta_s(cpu0, bc.proc_tree_cpu_s(srv.pid))
        out["cpu_ms_per_request"] = round(cpu * 1000.0 / ok, 2)
        out["server_cpu_cores"] = round(cpu / res.elapsed_s, 3) if res.elapsed_s else None
        out["wakeups_per_request"] = round((bc.proc_tree_switches(srv.pid) - sw0) / ok, 1)
        out["page_faults_per_request"] = round((bc.proc_tree_minor_faults(srv.pid) - pf0) / ok, 1)
        thr1 = bc.thread_cpu_s(srv.pid, names)
        by_thread = {k: (v - thr0.get(k, 0.0)) * 1000.0 / ok for k, v in thr1.items()}
        out["cpu_ms_per_request_by_thread"] = {k: round(v, 2) for k, v in
                                               sorted(by_thread.items(), key=lambda kv: -kv[1])[:8] if v >= 0.05}
    if extra is not None:
        out["burst_drain_ms"] = extra
    m1 = _triton_metrics(srv)
    if m0 and m1:
        from appliance.tools.benchpeer import batch_stats

        out["triton_batches"] = batch_stats(m0, m1, srv.batch)
    s1 = await _status(status)
    if s1:
        out.update(s1)
        if s0 and ok:  # mean real items per batch over this pattern, from the daemon's batch counter
            batches = s1["server"]["batches"] - s0["server"]["batches"]
            out["mean_batch"] = round(ok / batches, 2) if batches > 0 else None
    srv.raw[pattern] = list(res.latencies)
    srv.scores.update(res.scores)
    return out


async def _status(status: _StatusCall | None) -> dict[str, Any]:
    if status is None:
        return {}
    with contextlib.suppress(grpc.aio.AioRpcError, KeyError):
        return await status()
    return {}


def _triton_metrics(srv: _Server) -> dict[str, float]:
    if srv.metrics_port is None:
        return {}
    from appliance.tools.benchpeer import triton_metrics

    try:
        return triton_metrics(srv.metrics_port)
    except OSError:
        return {}


async def _patterns(args: argparse.Namespace, files: list[bytes], servers: list[_Server]) -> dict[str, Any]:
    n = len(files)
    channels = {s.name: grpc.aio.insecure_channel(s.target, options=loadgen.CHANNEL_OPTIONS) for s in servers}
    senders = {
        s.name: (loadgen.appliance_sender(channels[s.name], files, args.pipeline) if s.name == "appliance"
                 else loadgen.kserve_sender(channels[s.name], files))
        for s in servers
    }
    from appliance.tools.bench import status_fields

    status: dict[str, _StatusCall] = {
        "appliance": (lambda: status_fields(pb_grpc.InferenceStub(channels["appliance"])))}
    turn = 0

    def ordered() -> list[_Server]:
        nonlocal turn
        turn += 1
        return servers if turn % 2 else servers[::-1]

    async def each(pattern: str, run: Callable[[loadgen.Sender], Awaitable[Any]]) -> dict[str, Any]:
        return {s.name: await _point(s, pattern, senders[s.name], run, status.get(s.name)) for s in ordered()}

    out: dict[str, Any] = {"sweep": {s.name: {} for s in servers}}
    try:
        points = sorted(set(args.sweep) | {args.concurrency})
        for c in points:
            got = await each(f"closed-{c}", functools.partial(
                loadgen.closed_loop, n_files=n, concurrency=c, duration_s=args.duration, requests=args.requests))
            for name, value in got.items():
                out["sweep"][name][c] = value
        capacity = {name: sw[max(points)]["throughput_per_s"] for name, sw in out["sweep"].items()}
        out["capacity_per_s"] = capacity
        dur = (args.duration or 10.0) * 1.5
        if args.poisson or args.poisson_rate:
            rate = args.poisson_rate or args.poisson * min(capacity.values())
            out["poisson"] = {"fraction": args.poisson, "rate_per_s": round(rate, 2), "duration_s": dur,
                              **await each("poisson", lambda send: loadgen.poisson(
                                  send, n, rate_per_s=rate, duration_s=dur, seed=args.seed))}
            own = args.poisson * capacity["appliance"]
            app = next(s for s in servers if s.name == "appliance")
            if args.poisson and not args.poisson_rate and abs(own - rate) > 0.05 * rate:
                out["poisson_own"] = {"fraction": args.poisson, "rate_per_s": round(own, 2), "duration_s": dur,
                                      "appliance": await _point(app, "poisson-own", senders["appliance"],
                                                                lambda send: loadgen.poisson(
                                                                    send, n, rate_per_s=own, duration_s=dur,
                                                                    seed=args.seed), status["appliance"])}
        if args.bursts:
            size, period, count = (float(x) for x in args.bursts.lower().split("x"))
            out["bursts"] = {"size": int(size), "period_s": period, "count": int(count),
                             **await each("bursts", lambda send: loadgen.bursts(
                                 send, n, size=int(size), period_s=period, count=int(count)))}
    finally:
        for ch in channels.values():
            await ch.close()
    return out


def _start_peer(python: Path, instances: int, delay_us: int, log_stem: Path, pipeline: Path,
                tries: int = 3) -> Any:
    """Start a Triton peer and wait until it is ready; retry a failed start.

    PyTriton's Python-backend stub waits only 1 s (hard-coded) for its handshake with the PyTriton process; on
    a loaded machine the model load then fails ("Timeout occurred while waiting for config file"). A retry
    is a fresh start, so it measures nothing different.
    """
    from appliance.tools.benchpeer import TritonPeer

    for attempt in range(1, tries + 1):
        peer = TritonPeer(python, instances=instances, queue_delay_us=delay_us, pipeline=pipeline,
                          log_path=log_stem.with_name(f"{log_stem.name}-{attempt}.log"))
        try:
            peer.ready_s = peer.wait_ready()
            return peer
        except (RuntimeError, TimeoutError):
            peer.stop()
            if attempt == tries:
                raise
    raise AssertionError("unreachable")


def _batch(args: argparse.Namespace) -> int:
    return int(_load_model(args)[1].input.shape[0])


def _tune_peer(args: argparse.Namespace, files: list[bytes], python: Path, logdir: Path,
               pipeline_toml: Path) -> dict[str, Any]:
    """Try every (instances, queue delay) on ``pipeline_toml``; keep the best throughput at ``--concurrency``."""
    trials = []
    for inst in args.peer_instances:
        for delay in args.peer_delays_ms:
            try:
                peer = _start_peer(python, inst, delay * 1000, logdir / f"triton-tune-{inst}-{delay}",
                                   pipeline_toml)
            except (RuntimeError, TimeoutError) as e:
                trials.append({"instances": inst, "queue_delay_ms": float(delay), "intra_op_threads": 1,
                               "throughput_per_s": 0.0, "errors": {"START_FAILED": 1}, "error": str(e)})
                continue
            try:
                srv = _Server("triton", peer.target, peer.pid, peer.metrics_port, _batch(args))
                res = asyncio.run(_one(srv, files, args, warm=True))
                trials.append({**peer.config(), "throughput_per_s": res["throughput_per_s"],
                               "p99_ms": res["latency_ms"]["p99"], "cpu_ms_per_request": res.get("cpu_ms_per_request"),
                               "mean_batch": res.get("triton_batches", {}).get("mean_batch"),
                               "errors": res["errors"]})
            finally:
                peer.stop()
    best = max(trials, key=lambda t: (not t["errors"], t["throughput_per_s"]))
    return {"trials": trials, "best": {k: best[k] for k in ("instances", "queue_delay_ms", "intra_op_threads")}}


async def _one(srv: _Server, files: list[bytes], args: argparse.Namespace, warm: bool) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(srv.target, options=loadgen.CHANNEL_OPTIONS) as ch:
        send = loadgen.kserve_sender(ch, files) if srv.name == "triton" else loadgen.appliance_sender(ch, files)
        if warm and args.warmup:
            await loadgen.closed_loop(send, len(files), concurrency=args.concurrency, requests=args.warmup)
        return await _point(srv, "tune", send, lambda s: loadgen.closed_loop(
            s, len(files), concurrency=args.concurrency, duration_s=args.peer_tune_s))


def _costs_again(args: argparse.Namespace, files: list[bytes], pipeline: Any, manifest: Any,
                 report: dict[str, Any]) -> None:
    """Measure the per-slice costs again after the load; base the ceilings on the mean of the two phases.

    The load patterns run minutes after the first cost phase, and a shared box drifts by tens of per cent in that
    time (docs/performance.md, section 2): one phase alone can put the ceiling on either side of the load.
    ``cost_drift`` (after / before) says how far it moved.
    """
    after = _costs(args, files, pipeline, manifest)["costs"]
    before = report["costs"]
    pre = (before["preprocess"]["mean_ms"], after["preprocess"]["mean_ms"])
    eng = (before["engine_batch_ms"], after["engine_batch_ms"])
    report["costs_after"] = {"preprocess_mean_ms": pre[1], "engine_batch_ms": eng[1], "cpu": after["cpu"]}
    report["cost_drift"] = {"preprocess": round(pre[1] / pre[0], 3), "engine": round(eng[1] / eng[0], 3)}
    ceil = report["ceiling"]
    report["ceiling"] = {"cores": ceil["cores"], "workers": ceil["workers"],
                         "costs": "mean of the cost phases before and after the load",
                         **bc.ceilings(sum(pre) / 2, sum(eng) / 2, before["batch_size"], ceil["cores"],
                                       ceil["workers"])}


def run_extended(args: argparse.Namespace, files: list[bytes], report: dict[str, Any], logdir: Path,
                 daemon_cls: Any, measure: Any, warm: Any) -> None:
    """Fill ``report`` with the extended run (see the module docstring)."""
    from appliance.tools import benchpeer

    pipeline, manifest = _load_model(args)
    if args.costs:
        report.update(_costs(args, files, pipeline, manifest))
    peer_info: dict[str, Any] = {}
    servers: list[_Server] = []
    daemon = peer = None
    try:
        if args.target:
            servers.append(_Server("appliance", args.target, args.target_pid))
            report["target"] = args.target
        else:
            daemon = daemon_cls(list(args.serve_args), logdir / "daemon-overlap.log")
            daemon.wait_serving()
            warm(daemon.target, files, args)
            servers.append(_Server("appliance", daemon.target, daemon.pid))
        if args.peer == "triton":
            python = args.peer_python or benchpeer.default_peer_python()
            peer_info["inputs"] = benchpeer.check_inputs(python, files, bc.inputs_digest(files, pipeline),
                                                         pipeline.path)
            t0 = time.monotonic()
            if len(args.peer_instances) * len(args.peer_delays_ms) > 1:
                peer_info["tuning"] = _tune_peer(args, files, python, logdir, pipeline.path)
                best = peer_info["tuning"]["best"]
            else:
                best = {"instances": args.peer_instances[0], "queue_delay_ms": args.peer_delays_ms[0],
                        "intra_op_threads": 1}
            peer_info["tuning_s"] = round(time.monotonic() - t0, 1)
            peer = _start_peer(python, best["instances"], int(best["queue_delay_ms"] * 1000), logdir / "triton",
                               pipeline.path)
            peer_info["ready_s"] = round(peer.ready_s, 2)
            peer_info["config"] = peer.config()
            peer_info["server"] = "Triton 2.51.0 (PyTriton 0.7.0), Python callable, ONNX Runtime CPU"
            srv = _Server("triton", peer.target, peer.pid, peer.metrics_port, int(manifest.input.shape[0]))
            if args.warmup:
                asyncio.run(_warm_kserve(srv, files, args))
            servers.append(srv)
        results = asyncio.run(_patterns(args, files, servers))
    finally:
        if peer is not None:
            peer.stop()
        if daemon is not None:
            daemon.stop()
    if args.costs:
        _costs_again(args, files, pipeline, manifest, report)
    benchreport.fill(report, results, args.concurrency, [s.scores for s in servers], peer_info)
    if not args.target and not args.no_sequential:
        seq = measure(args, files, [*args.serve_args, "--no-overlap"], logdir, "sequential")
        report["sequential"] = seq
        report["sequential_throughput_per_s"] = seq["throughput_per_s"]
        report["speedup_vs_sequential"] = ratio(report["throughput_per_s"], seq["throughput_per_s"])
    if args.self_workload and not args.target:
        report["self"] = _self_comparison(args, logdir, measure)
    benchreport.targets(report)
    if args.plot:
        from appliance.tools.benchplot import plot

        report["plots"] = plot(report, {s.name: s.raw for s in servers}, args.plot)


async def _warm_kserve(srv: _Server, files: list[bytes], args: argparse.Namespace) -> None:
    async with grpc.aio.insecure_channel(srv.target, options=loadgen.CHANNEL_OPTIONS) as ch:
        await loadgen.closed_loop(loadgen.kserve_sender(ch, files), len(files), concurrency=args.concurrency,
                                  requests=args.warmup)


def _self_comparison(args: argparse.Namespace, logdir: Path, measure: Any) -> dict[str, Any]:
    """Overlap vs ``--no-overlap`` on ``--self-workload`` (preprocessing and engine time comparable)."""
    from appliance.tools import synthetic

    files = synthetic.workload(args.self_workload, args.files, args.seed)
    out: dict[str, Any] = {"workload": args.self_workload}
    if args.costs:  # the arithmetic sequential baseline: B files preprocessed back to back, then one full batch
        pipeline, manifest = _load_model(args)
        batch = int(manifest.input.shape[0])
        with bc.pinned():
            pre = bc.preprocess_costs(files, pipeline)
            engine_ms = bc.engine_cost(manifest)
        out["costs"] = {"preprocess_mean_ms": pre["mean_ms"], "engine_batch_ms": round(engine_ms, 3),
                        **bc.ceilings(pre["mean_ms"], engine_ms, batch, len(os.sched_getaffinity(0)),
                                      args.workers or max(1, len(os.sched_getaffinity(0)) - 1))}
        out["ideal_sequential_per_s"] = round(batch * 1000.0 / (batch * pre["mean_ms"] + engine_ms), 2)
    overlap = measure(args, files, list(args.serve_args), logdir, "self-overlap")
    seq = measure(args, files, [*args.serve_args, "--no-overlap"], logdir, "self-sequential")
    out.update({"overlap": overlap, "sequential": seq,
                "speedup_vs_sequential": ratio(overlap["throughput_per_s"], seq["throughput_per_s"])})
    if "ideal_sequential_per_s" in out:
        out["speedup_vs_ideal_sequential"] = ratio(overlap["throughput_per_s"], out["ideal_sequential_per_s"])
        out["pipelined_fraction"] = ratio(overlap["throughput_per_s"], out["costs"]["pipelined_bound_per_s"])
    return out
