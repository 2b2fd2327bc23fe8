"""GetStatus and ``appliance health --json``: one protobuf snapshot of every stage, built from their statistics.

Counts, timings and states only: nothing here can carry patient data (docs/security.md).
"""

from __future__ import annotations

from appliance import __version__
from appliance.batching.inbox import QueueStats
from appliance.proto.v1 import inference_pb2 as pb
from appliance.serving.health import ServiceState
from appliance.serving.metrics import Metrics
from appliance.thermal.control import ThermalStatus
from appliance.workers.pool import PoolStats

__all__ = ["degraded_reasons", "status_pb"]


#: A serving box that refused at least this share of at least OVERLOAD_MIN requests in the last minute is overloaded.
OVERLOAD_SHARE, OVERLOAD_MIN = 0.2, 20


def degraded_reasons(queue: QueueStats, thermal: ThermalStatus, refused: tuple[int, int] = (0, 0),
                     engine: str | None = None) -> list[str]:
    """Why a serving service is degraded (empty when healthy).

    Throttled or blind; the queue over 80 %; or many requests refused at once in the last minute (``refused``:
    refused RESOURCE_EXHAUSTED, all). The queue's depth at one instant missed an overload in which 193 of 300
    requests were refused QUEUE_FULL while health said OK (ops review, session 14). ``engine``: why the engine
    runs below what the machine has (``AutoEngine.fallback``).
    """
    reasons = [engine] if engine else []
    if thermal.degraded:
        reasons.append(f"thermal {thermal.state.lower()}")
    if queue.depth > 0.8 * queue.capacity:
        reasons.append(f"queue over 80% ({queue.depth}/{queue.capacity})")
    n_refused, n_all = refused
    if n_all >= OVERLOAD_MIN and n_refused >= OVERLOAD_SHARE * n_all:
        reasons.append(f"overloaded: {n_refused} of {n_all} requests refused RESOURCE_EXHAUSTED in the last minute")
    return reasons


def status_pb(*, state: ServiceState, reason: str, uptime_s: float, model: pb.Model, queue: QueueStats,
              thermal: ThermalStatus, pool: PoolStats, metrics: Metrics, batches: int,
              pipelines: list[str], default_pipeline: str, engine_fallback: str | None = None) -> pb.Status:
    """The detailed status; a SERVING service with degraded reasons reports ``DEGRADED``."""
    reasons = (degraded_reasons(queue, thermal, metrics.refused_recently(), engine_fallback)
               if state == ServiceState.SERVING else [reason])
    status = pb.Status(
        state="DEGRADED" if state == ServiceState.SERVING and reasons else state.value,
        uptime_s=uptime_s,
        model=model,
        queue_depth=queue.depth,
        queue_capacity=queue.capacity,
        batch_fill=metrics.fill.mean(),
        status_counts=metrics.status_counts(),
        thermal=pb.Thermal(
            enabled=thermal.enabled,
            state=thermal.state,
            temperature_c=thermal.temperature_c if thermal.temperature_c is not None else 0.0,
            duty=thermal.duty,
            seconds_above_limit=thermal.seconds_above_limit,
            sensor_errors=thermal.sensor_errors,
            power_w=thermal.power_w if thermal.power_w is not None else 0.0,
            reason=thermal.reason,
        ),
        version=__version__,
        batches=batches,
        degraded_reasons=reasons,
        pipelines=pipelines,
        default_pipeline=default_pipeline,
        worker_restarts=pool.restarts,
        workers=pool.workers,
    )
    for stage, summary in metrics.latency_summaries().items():
        status.latency_ms[stage].CopyFrom(
            pb.Percentiles(p50=summary.p50, p90=summary.p90, p99=summary.p99, count=summary.count)
        )
    return status
