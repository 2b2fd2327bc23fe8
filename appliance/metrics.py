"""Prometheus metrics plus in-process sliding windows for percentiles (GetStatus, `appliance health`).

Names follow Prometheus practice: ``appliance_`` prefix, base units (seconds, celsius), ``_total`` counters,
no high-cardinality labels (never request ids or UIDs). Each App owns its own registry, so several daemons
can live in one test process.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from appliance.batcher import BatchObserver
from appliance.work import ItemState, WorkItem

__all__ = ["Metrics", "PercentileSummary", "SlidingWindow"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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
        self.requests = Counter(
            "appliance_requests", "Analyze requests by final gRPC status code", ["code"], registry=r
        )
        self.rejections = Counter(
            "appliance_rejections", "Admissions refused at once, by reason", ["reason"], registry=r
        )
        self.frames = Counter("appliance_frames", "Frames finished, by final state", ["state"], registry=r)
        self.batches = Counter("appliance_batches", "Engine batches run", registry=r)
        self.padded_slots = Counter("appliance_padded_slots", "Batch slots filled with padding", registry=r)
        self.stage_seconds = Histogram(
            "appliance_stage_duration_seconds", "Per-stage latency", ["stage"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.batch_fill_ratio = Gauge(
            "appliance_batch_fill_ratio", "Mean real items per batch / B (window)", registry=r
        )
        self.queue_depth = Gauge("appliance_queue_depth", "Frames admitted and not yet launched", registry=r)
        self.queue_capacity = Gauge("appliance_queue_capacity", "Inbox slots", registry=r)
        self.up = Gauge("appliance_serving", "1 while SERVING, else 0", registry=r)
        self.gpu_temperature = Gauge("appliance_gpu_temperature_celsius", "GPU temperature reading", registry=r)
        self.thermal_duty = Gauge("appliance_thermal_duty_ratio", "Pacing duty handed to the batcher", registry=r)
        self.thermal_state = Gauge("appliance_thermal_state", "Governor state (one-hot)", ["state"], registry=r)
        self.thermal_over_limit = Gauge(
            "appliance_thermal_over_limit_seconds", "Seconds with a reading above the limit", registry=r
        )
        self.thermal_sensor_errors = Gauge(
            "appliance_thermal_sensor_errors", "Sensor read errors since start", registry=r
        )
        self.worker_restarts = Counter(
            "appliance_decoder_worker_restarts", "Preprocessing worker processes replaced, by reason", ["reason"],
            registry=r,
        )
        self.restarts_total = 0
        self.windows = {stage: SlidingWindow(window) for stage in self.STAGES}
        self.fill = SlidingWindow(512)
        self._codes: collections.Counter[str] = collections.Counter()
        self._thermal_states: set[str] = set()
        self._lock = threading.Lock()

    # BatchObserver ---------------------------------------------------------------------------------------
    def on_batch(self, real: int, size: int, engine_s: float) -> None:
        """Record one batch."""
        self.batches.inc()
        self.padded_slots.inc(size - real)
        self.fill.add(real / size)
        self.batch_fill_ratio.set(self.fill.mean())
        self.observe_stage("engine", engine_s)

    def on_item(self, item: WorkItem) -> None:
        """Record one finished frame."""
        self.frames.labels(item.state.name).inc()
        if item.state == ItemState.DONE and item.t_launch is not None and item.t_ready is not None:
            self.observe_stage("queue", max(0.0, item.t_launch - item.t_ready))
        if item.preprocess_ms:
            self.observe_stage("preprocess", item.preprocess_ms / 1000.0)

    def on_rejected(self, reason: str) -> None:
        """Record one refused admission."""
        self.rejections.labels(reason).inc()

    def on_worker_restart(self, reason: str) -> None:
        """Record one replaced preprocessing worker."""
        self.worker_restarts.labels(reason).inc()
        with self._lock:
            self.restarts_total += 1

    def observe_thermal(self, snap: Any) -> None:
        """Export a thermal snapshot (appliance.thermal_control.ThermalStatus)."""
        if snap.temperature_c is not None:
            self.gpu_temperature.set(snap.temperature_c)
        self.thermal_duty.set(snap.duty)
        self.thermal_over_limit.set(snap.seconds_above_limit)
        self.thermal_sensor_errors.set(snap.sensor_errors)
        for state in self._thermal_states | {snap.state}:
            self.thermal_state.labels(state).set(1.0 if state == snap.state else 0.0)
        self._thermal_states.add(snap.state)

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
        if total_s is not None and code_name == "OK":
            self.observe_stage("total", total_s)

    def status_counts(self) -> dict[str, int]:
        """Return counts of finished requests by status code name."""
        with self._lock:
            return dict(self._codes)

    def latency_summaries(self) -> dict[str, PercentileSummary]:
        """Return p50/p90/p99 in ms for each stage."""
        return {stage: w.summary() for stage, w in self.windows.items()}
