"""Prometheus metrics plus in-process sliding windows for percentiles (GetStatus, `appliance health`).

Names follow Prometheus practice: ``appliance_`` prefix, base units (seconds, celsius, watts, ratios 0-1),
``_total`` counters, no high-cardinality labels (never request ids or UIDs). Each App owns its own registry,
so several daemons can live in one test process. :meth:`Metrics.serve` exposes it on ``/metrics`` from a
small HTTP thread (127.0.0.1:9400 by default, config key ``metrics.listen``); docs/monitoring.md lists every
series and the Grafana dashboard built on them.
"""

from __future__ import annotations

import collections
import math
import platform
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)
from prometheus_client.exposition import start_http_server

from appliance import __version__
from appliance.batching.batcher import BatchObserver
from appliance.batching.work import ItemState, WorkItem
from appliance.errors import ConfigError
from appliance.governor import GovernorState

__all__ = ["LATENCY_BUCKETS", "Metrics", "PercentileSummary", "SlidingWindow", "parse_listen"]

#: Seconds; dense (10 ms steps) from 20 to 110 ms around the 100 ms budget, coarse outside it.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.11,
    0.125, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


@dataclass(frozen=True)
class PercentileSummary:
    """p50/p90/p99 of a window, in the window's unit, and the number of samples."""

    p50: float
    p90: float
    p99: float
    count: int


class SlidingWindow:
    """The last ``size`` samples; thread-safe percentiles over them."""

    def __init__(self, size: int = 2048) -> None:
        self._values: collections.deque[float] = collections.deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, value: float) -> None:
        """Record one sample."""
        with self._lock:
            self._values.append(value)

    def summary(self) -> PercentileSummary:
        """Return p50/p90/p99 (zeros when empty)."""
        with self._lock:
            values = np.fromiter(self._values, dtype=np.float64)
        if values.size == 0:
            return PercentileSummary(0.0, 0.0, 0.0, 0)
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        return PercentileSummary(float(p50), float(p90), float(p99), int(values.size))

    def mean(self) -> float:
        """Return the mean (0 when empty)."""
        with self._lock:
            return float(np.mean(self._values)) if self._values else 0.0


class Metrics(BatchObserver):
    """All counters, gauges and windows of one daemon."""

    STAGES = ("queue", "preprocess", "engine", "total")

    def __init__(self, window: int = 2048) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # the daemon process's own RSS, CPU, open files and start time (process_*), and python_*: a slow leak or
        # a restart loop shows on them (the alert rules in docs/prometheus/alerts.yml use them)
        for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(standard)
        self.requests = Counter(
            "appliance_requests", "Analyze requests by final gRPC status code", ["code"], registry=r
        )
        self.rejections = Counter(
            "appliance_rejections", "Admissions refused at once, by reason", ["reason"], registry=r
        )
        for reason in ("QUEUE_FULL", "SENDER_SHARE", "DEADLINE_UNMEETABLE"):  # exported at 0: dashboards see them
            self.rejections.labels(reason)
        self.frames = Counter("appliance_frames", "Frames finished, by final state", ["state"], registry=r)
        self.lowpass_frames = Counter(
            "appliance_jpeg2000_lowpass_frames",
            "Frames decoded at half resolution (a JPEG 2000 low-pass band stood in for the area resize)", registry=r
        )
        self.batches = Counter("appliance_batches", "Engine batches run", registry=r)
        self.padded_slots = Counter("appliance_padded_slots", "Batch slots filled with padding", registry=r)
        self.stage_seconds = Histogram(
            "appliance_stage_duration_seconds", "Per-stage latency", ["stage"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_slots = Counter("appliance_batch_slots", "Batch slots launched (B per batch)", registry=r)
        self.engine_busy = Counter(
            "appliance_engine_busy_seconds", "Seconds the engine spent running batches", registry=r
        )
        self.batch_fill_ratio = Gauge(
            "appliance_batch_fill_ratio", "Mean real items per batch / B (window)", registry=r
        )
        self.queue_depth = Gauge("appliance_queue_depth", "Frames admitted and not yet launched", registry=r)
        self.queue_capacity = Gauge("appliance_queue_capacity", "Inbox slots", registry=r)
        self.up = Gauge("appliance_serving", "1 while SERVING, else 0", registry=r)
        self.gpu_temperature = Gauge("appliance_gpu_temperature_celsius", "GPU temperature reading", registry=r)
        self.gpu_power = Gauge("appliance_gpu_power_watts", "GPU power draw reading", registry=r)
        # NaN until a reading exists (none on a box without a GPU): 0 read as a cold GPU (ops review, session 18)
        self.gpu_temperature.set(math.nan)
        self.gpu_power.set(math.nan)
        self.thermal_duty = Gauge("appliance_thermal_duty_ratio", "Pacing duty handed to the batcher", registry=r)
        self.thermal_state = Gauge("appliance_thermal_state", "Governor state (one-hot)", ["state"], registry=r)
        for state in GovernorState:
            self.thermal_state.labels(state.name).set(0.0)
        self.thermal_above_limit = Counter(
            "appliance_thermal_above_limit_seconds", "Seconds with a reading above the limit", registry=r
        )
        self.thermal_sensor_errors = Counter(
            "appliance_thermal_sensor_errors", "Temperature sensor read errors", registry=r
        )
        self.worker_restarts = Counter(
            "appliance_decoder_worker_restarts",
            "Decoder worker processes restarted, by reason",
            ["reason"],
            registry=r,
        )
        self.build_info = Info("appliance_build", "Version of the appliance and what it serves", registry=r)
        self._build = {"version": __version__, "python": platform.python_version()}
        self.build_info.info(self._build)
        self._thermal_totals = (0.0, 0)  # last seconds_above_limit, sensor_errors seen (counters grow by delta)
        self._http: Any = None
        self.windows = {stage: SlidingWindow(window) for stage in self.STAGES}
        self.fill = SlidingWindow(512)
        self._codes: collections.Counter[str] = collections.Counter()
        # (monotonic time, refused at once): the share of recent requests refused RESOURCE_EXHAUSTED (overload)
        self._recent: collections.deque[tuple[float, bool]] = collections.deque(maxlen=8192)
        self._lock = threading.Lock()

    # BatchObserver ---------------------------------------------------------------------------------------
    def on_batch(self, real: int, size: int, engine_s: float) -> None:
        """Record one batch."""
        self.batches.inc()
        self.batch_slots.inc(size)
        self.padded_slots.inc(size - real)
        self.engine_busy.inc(max(0.0, engine_s))
        self.fill.add(real / size)
        self.batch_fill_ratio.set(self.fill.mean())
        self.observe_stage("engine", engine_s)

    def on_item(self, item: WorkItem) -> None:
        """Record one finished frame."""
        self.frames.labels(item.state.name).inc()
        if item.frame_info is not None and item.frame_info.lowpass:
            self.lowpass_frames.inc()
        if item.state == ItemState.DONE and item.t_launch is not None and item.t_ready is not None:
            self.observe_stage("queue", max(0.0, item.t_launch - item.t_ready))
        if item.preprocess_ms:
            self.observe_stage("preprocess", item.preprocess_ms / 1000.0)

    def on_rejected(self, reason: str) -> None:
        """Record one refused admission."""
        self.rejections.labels(reason).inc()

    def on_worker_restart(self, reason: str) -> None:
        """Record one decoder worker restart (reason: a short fixed word such as ``crash`` or ``hang``)."""
        self.worker_restarts.labels(reason).inc()

    def observe_thermal(self, snap: Any) -> None:
        """Export a thermal snapshot (appliance.thermal_control.ThermalStatus)."""
        if snap.temperature_c is not None:
            self.gpu_temperature.set(snap.temperature_c)
        if getattr(snap, "power_w", None) is not None:
            self.gpu_power.set(snap.power_w)
        self.thermal_duty.set(snap.duty)
        with self._lock:
            above, errors = self._thermal_totals
            self._thermal_totals = (max(above, snap.seconds_above_limit), max(errors, snap.sensor_errors))
        if snap.seconds_above_limit > above:
            self.thermal_above_limit.inc(snap.seconds_above_limit - above)
        if snap.sensor_errors > errors:
            self.thermal_sensor_errors.inc(snap.sensor_errors - errors)
        for state in GovernorState:
            self.thermal_state.labels(state.name).set(1.0 if state.name == snap.state else 0.0)

    def set_build_info(self, **labels: str) -> None:
        """Add labels (model, precision, backend, ...) to ``appliance_build_info``."""
        self._build.update({k: str(v) for k, v in labels.items()})
        self.build_info.info(self._build)

    # exposition ------------------------------------------------------------------------------------------
    def serve(self, listen: str) -> str:
        """Serve ``/metrics`` on ``host:port`` (port 0 picks one); return the bound address, "" when off.

        Raises ConfigError naming ``metrics.listen`` when the address is malformed or cannot be bound, so a
        bad address fails the start instead of silently losing monitoring.
        """
        if not listen:
            return ""
        host, port = parse_listen(listen)
        try:
            self._http, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise ConfigError(f"config key metrics.listen: cannot bind {listen!r}: {e.strerror or e}") from e
        bound = self._http.server_address[1]
        return f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"

    def close(self) -> None:
        """Stop serving ``/metrics`` (if started)."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    # requests --------------------------------------------------------------------------------------------
    def observe_stage(self, stage: str, seconds: float) -> None:
        """Record one stage duration."""
        self.stage_seconds.labels(stage).observe(seconds)
        self.windows[stage].add(seconds * 1000.0)

    def count_request(self, code_name: str, total_s: float | None = None) -> None:
        """Count one finished Analyze item by its final status code name."""
        self.requests.labels(code_name).inc()
        with self._lock:
            self._codes[code_name] += 1
            self._recent.append((time.monotonic(), code_name == "RESOURCE_EXHAUSTED"))
        if total_s is not None and code_name == "OK":
            self.observe_stage("total", total_s)

    def refused_recently(self, window_s: float = 60.0) -> tuple[int, int]:
        """(Requests refused RESOURCE_EXHAUSTED, all requests) finished in the last ``window_s`` seconds."""
        since = time.monotonic() - window_s
        with self._lock:
            recent = [refused for t, refused in self._recent if t >= since]
        return sum(recent), len(recent)

    def status_counts(self) -> dict[str, int]:
        """Return counts of finished requests by status code name."""
        with self._lock:
            return dict(self._codes)

    def latency_summaries(self) -> dict[str, PercentileSummary]:
        """Return p50/p90/p99 in ms for each stage."""
        return {stage: w.summary() for stage, w in self.windows.items()}


def parse_listen(listen: str) -> tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port`` (no host: 127.0.0.1); ConfigError naming ``metrics.listen``."""
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"config key metrics.listen: expected host:port (e.g. 127.0.0.1:9400), got {listen!r}")
    return host, int(port)
