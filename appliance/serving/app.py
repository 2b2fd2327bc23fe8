"""Composition root: builds the parts in data-path order, then start, warm-up, READY, drain, stop.

server (grpc.aio) -> request path (analyze.py: byte budget, admission) -> worker processes (parse, decode,
preprocess into a shared slot) -> batcher -> engine (one thread) -> postprocess -> reply
side channels: health (gRPC health + sd_notify + GetStatus, fed by every stage's progress) · metrics ·
thermal controller -> pacer
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from appliance import dicom, privacy
from appliance.batching.batcher import Batcher, Pacer
from appliance.clock import Clock, RealClock
from appliance.config import Config
from appliance.engines import resolve
from appliance.engines.base import usable_cores
from appliance.errors import ConfigError, Unavailable
from appliance.manifest import Manifest, load_manifest
from appliance.pipeline.loader import load_pipelines
from appliance.pipeline.postprocess import Postprocessor
from appliance.pipeline.preprocess import Pipeline
from appliance.proto.v1 import inference_pb2 as pb
from appliance.proto.v1 import inference_pb2_grpc as pb_grpc
from appliance.serving import access, listen, oip, reflection
from appliance.serving.analysis import ModelInfo
from appliance.serving.analyze import PathLimits, RequestPath
from appliance.serving.health import HealthState, ServiceState
from appliance.serving.liveness import Stage, StageProgress, stalled
from appliance.serving.metrics import Metrics
from appliance.serving.notify import Notifier, SystemdNotifier, Watchdog
from appliance.serving.server import InferenceServicer
from appliance.serving.status import status_pb
from appliance.serving.thermal_loop import ThermalLoop, build_thermal
from appliance.thermal.control import HealthAction, health_action
from appliance.thermal_control import ThermalController
from appliance.workers.arena import SlotArena
from appliance.workers.child import WorkerSpec
from appliance.workers.pool import WorkerPool

__all__ = ["App", "preprocess_workers", "served_pipelines"]

log = logging.getLogger(__name__)


class App:
    """One daemon. Construct (cheap, validates config/manifest/pipelines), ``await start()``, ``await stop()``."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        notifier: Notifier | None = None,
        engine_options: dict[str, Any] | None = None,
        thermal: ThermalController | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or RealClock()
        self.notifier = notifier or SystemdNotifier()
        self.metrics = Metrics(config.metrics.window)
        # model and pipelines: validated now, so a bad config fails before anything binds
        self.manifest = load_manifest(config.models_dir() / config.model.name / "model.toml")
        self.artifact = self.manifest.configured_artifact(config.model.precision)
        self.pipelines, self.default_pipeline = served_pipelines(config, self.manifest)
        self.limits = dicom.DicomLimits(
            max_bytes=config.server.max_message_bytes,
            max_pixels_per_frame=config.dicom.max_pixels_per_frame,
            max_frames=config.dicom.max_frames,
            max_decoded_bytes=config.dicom.max_decoded_bytes,
            max_inflated_bytes=config.dicom.max_inflated_bytes,
            max_items=config.dicom.max_items,
            max_elements=config.dicom.max_elements,
            max_decode_ratio=config.dicom.max_decode_ratio,
        )
        self.postprocess = Postprocessor(self.manifest)
        # engine + slot arena + batcher (the engine is loaded on its own thread in start())
        engine_cls, self.skipped_backends = resolve(config.engine.backend)
        options: dict[str, Any] = {"intra_op_threads": config.engine.intra_op_threads,
                                   "allow_spinning": config.engine.allow_spinning,
                                   "burst_threads": config.engine.burst_threads,
                                   "worker_nice": config.workers.nice}  # the burst pool runs below the workers
        options.update(config.engine.options.as_dict())
        options.update(engine_options or {})
        self.engine = engine_cls(self.manifest, self.artifact, options)
        self.pacer = Pacer(self.clock)
        self.arena = SlotArena.create(config.batcher.queue_capacity, tuple(self.engine.item_shape))
        self.batcher = Batcher(
            self.engine,
            config.batcher,
            clock=self.clock,
            pacer=self.pacer,
            observer=self.metrics,
            on_engine_dead=self._engine_dead,
            arena=self.arena.slots,
        )
        # preprocessing worker processes: parse, decode and preprocess straight into the arena's slots
        self.pool = WorkerPool(
            WorkerSpec(
                arena=self.arena.spec,
                pipelines_dir=str(config.pipelines_dir()),
                models_dir=str(config.models_dir()),
                model=self.manifest.name,
                limits=self.limits,
                memory_bytes=config.workers.memory_bytes,
                nice=config.workers.nice,
                heap_keep_bytes=config.workers.heap_keep_bytes,
                faults=os.environ.get("APPLIANCE_TEST_DECODER_FAULTS") == "1",
            ),
            config.workers,
            workers=preprocess_workers(config),
            batcher=self.batcher,
            clock=self.clock,
            on_restart=self.metrics.on_worker_restart,
            stage_lock=self.batcher.stage_lock,
            cores=usable_cores(),
        )
        self.pool.engine_cores = self.batcher.engine_cores
        self.batcher.parsing = self.pool.unadmitted
        self.batcher.preprocessing_idle = self.pool.idle
        self.batcher.preprocess_cores = min(self.pool.workers, max(1, _cores_left_by_engine(config)))
        # the one request path, which every protocol front end calls
        self.path = RequestPath(
            model=ModelInfo(
                name=self.manifest.name,
                version=self.manifest.version,
                precision=self.artifact.precision,
                backend=self.engine.name,
                batch_size=self.engine.batch_size,
                input_name=self.manifest.input.name,
                item_shape=tuple(self.engine.item_shape),
                outputs=tuple((o.name, tuple(o.shape[1:])) for o in self.manifest.outputs),
            ),
            pipelines=frozenset(self.pipelines),
            default_pipeline=self.default_pipeline,
            pool=self.pool,
            batcher=self.batcher,
            postprocess=self.postprocess,
            clock=self.clock,
            limits=PathLimits(config.server.max_message_bytes, config.server.inflight_bytes,
                              config.server.default_deadline_s, max_unadmitted=config.batcher.queue_capacity),
            check_admitting=self.check_admitting,
            validate_request_id=privacy.validate_request_id,
            on_finished=self.metrics.count_request,
        )
        self.thermal = thermal or build_thermal(
            config.thermal, self.clock, self.pacer.take_busy_fraction, gpu_engine="cuda" in engine_cls.name,
            cuda_device=int(getattr(config.engine.options, "device_id", 0)),
        )
        self.thermal_loop = ThermalLoop(self.thermal, pacer=self.pacer, batcher=self.batcher, metrics=self.metrics,
                                        clock=self.clock, period_s=config.thermal.period_s)
        self.health: HealthState | None = None
        self.server: grpc.aio.Server | None = None
        self.addresses: list[str] = []
        self.metrics_address = ""  # bound /metrics host:port once started ("" = off)
        self._t_start = self.clock.monotonic()
        self._tasks: list[asyncio.Task[Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.fatal: str | None = None  # why the process must end and be restarted (an engine death)
        self.fatal_event = asyncio.Event()
        self.stages = self._stages()

    # ---- used by the request path and the servicers -----------------------------------------------------

    def check_admitting(self) -> None:
        """Raise Unavailable unless the service admits new work."""
        assert self.health is not None
        state = self.health.state
        if state == ServiceState.SERVING:
            return
        reason = {
            ServiceState.STARTING: "WARMING_UP",
            ServiceState.DRAINING: "DRAINING",
        }.get(state, "THERMAL_PAUSE" if self.health.reason.startswith("thermal") else "NOT_SERVING")
        word, why = state.value.lower(), self.health.reason
        raise Unavailable(f"service is {word}" + (f": {why}" if why and why != word else ""), reason=reason)

    def status_pb(self) -> pb.Status:
        """The detailed status (GetStatus, `appliance health --json`)."""
        assert self.health is not None
        return status_pb(
            state=self.health.state,
            reason=self.health.reason,
            uptime_s=self.clock.monotonic() - self._t_start,
            model=pb.Model(name=self.manifest.name, version=self.manifest.version, precision=self.engine.precision,
                           backend=self.engine.backend, batch_size=self.engine.batch_size),
            queue=self.batcher.statistics(),
            thermal=self.thermal.snapshot(),
            pool=self.pool.statistics(),
            metrics=self.metrics,
            batches=self.batcher.batches,
            pipelines=sorted(self.pipelines),
            default_pipeline=self.default_pipeline,
            engine_fallback=getattr(self.engine, "fallback", None),
        )

    # ---- lifecycle --------------------------------------------------------------------------------------

    def _server_options(self) -> list[tuple[str, int]]:
        limit = self.config.server.max_message_bytes
        return [
            ("grpc.max_receive_message_length", limit + (1 << 20)),  # + envelope; the handler states the limit
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 30_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.max_connection_idle_ms", 15 * 60_000),
            ("grpc.max_concurrent_streams", 256),  # per connection: one client cannot open unbounded streams
            ("grpc.so_reuseport", 0),  # a second daemon on the same port fails to start instead of sharing it
        ]

    async def start(self) -> None:
        """Bind, report NOT_SERVING, load and warm the engine on its thread, then SERVING + READY=1."""
        self._loop = asyncio.get_running_loop()
        health_servicer = health_aio.HealthServicer()
        self.health = HealthState(health_servicer, self.notifier)
        await self.health.init()
        server = grpc.aio.server(
            options=self._server_options(),
            maximum_concurrent_rpcs=self.config.server.max_concurrent_rpcs,
            interceptors=access.interceptors(self.config),
        )
        # frames one AnalyzeStream (or the files of one OIP request) may have admitted at once
        window = max(self.batcher.batch_size, self.config.batcher.queue_capacity // 2)
        servicer = InferenceServicer(
            self.path,
            self.status_pb,
            stream_window=window,
        )
        pb_grpc.add_InferenceServicer_to_server(servicer, server)
        # the Open Inference Protocol: the same request path
        oip.add_to_server(server, self.path, max_files=self.config.batcher.queue_capacity, frame_window=window,
                          max_message_bytes=self.config.server.max_message_bytes)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        if reflection.reflection_enabled(self.config):  # off with TLS listeners unless server.reflection = true
            names = (pb.DESCRIPTOR.services_by_name["Inference"].full_name, oip.SERVICE_NAME, "grpc.health.v1.Health")
            reflection.enable_reflection(server, names)  # v1alpha and v1
        # docs/security.md: socket directories checked, sockets 0660, TLS/mTLS with certificate reload;
        # metrics bound here too, so every bind failure is a ConfigError before READY=1.
        self.addresses.extend(listen.bind_listeners(server, self.config))
        self.server = server
        await server.start()
        # /metrics before the engine loads: a bad metrics.listen fails the start (docs/monitoring.md)
        try:
            self.metrics_address = self.metrics.serve(self.config.metrics.listen)
        except BaseException:
            await server.stop(0)  # a server left for the garbage collector would outlive its event loop
            raise
        log.info(
            "listening on %s; loading %s (%s)", ", ".join(self.addresses), self.manifest.name, self.artifact.precision
        )
        for name, why in self.skipped_backends.items():
            log.info("engine backend %s skipped: %s", name, why)
        if self.pool.spec.faults:
            log.warning("TEST ONLY: decoder fault injection is on (APPLIANCE_TEST_DECODER_FAULTS=1)")
        await asyncio.get_running_loop().run_in_executor(None, self.artifact.verify)
        self.pool.start()
        ready = self.batcher.start(self.config.engine.warmup_runs)
        while not ready.is_set():  # polled, so a SIGTERM during a long load/build is not held up
            await asyncio.sleep(0.05)
        if self.batcher.start_error is not None:
            raise self.batcher.start_error
        timeout = self.config.workers.start_timeout_s
        if not await asyncio.get_running_loop().run_in_executor(None, self.pool.wait_started, timeout):
            raise Unavailable(f"preprocessing workers did not start within {timeout} s (workers.start_timeout_s)")
        log.info(
            "engine ready: %s on %s, B=%d, %.1f ms/batch after warm-up",
            self.engine.precision,
            self.engine.backend,
            self.engine.batch_size,
            self.batcher.batch_s_estimate * 1e3,
        )
        self.path.model = dataclasses.replace(
            self.path.model, backend=self.engine.backend, precision=self.engine.precision
        )
        self.metrics.set_build_info(
            model=self.manifest.name, precision=self.engine.precision, backend=self.engine.backend
        )
        await self.health.set_serving()
        thermal_task = asyncio.create_task(self.thermal_loop.run(self.health), name="thermal")
        thermal_task.add_done_callback(lambda task: self.thermal_loop.died(task, self.health))
        self._tasks.append(thermal_task)
        self._tasks.append(asyncio.create_task(self._supervise(), name="supervise"))
        if self.notifier.watchdog_interval_s:
            watchdog = Watchdog(
                self.notifier,
                heartbeat=self._heartbeat,
                clock_monotonic=self.clock.monotonic,
                max_staleness_s=max(self.notifier.watchdog_interval_s, 0.5),
            )
            self._tasks.append(asyncio.create_task(watchdog.run(), name="watchdog"))

    def _stages(self) -> list[Stage]:
        """Every stage whose progress health and the watchdog follow."""
        stall = self.config.server.stall_s

        def workers() -> StageProgress:
            stats = self.pool.statistics()
            return StageProgress(stats.queued + stats.busy, stats.last_progress)

        def engine() -> StageProgress:  # the engine thread ticks at least every 0.1 s while it lives
            return StageProgress(1, self.batcher.heartbeat)

        def thermal() -> StageProgress:
            return StageProgress(1, self.thermal_loop.tick)

        period = self.config.thermal.period_s
        return [
            Stage("preprocessing workers", workers, max(stall, self.config.workers.step_timeout_s + 5.0)),
            Stage("engine", engine, stall),
            Stage("thermal loop", thermal, max(stall, 3 * period + 5.0)),
        ]

    async def _supervise(self) -> None:
        """Twice a second.

        a stalled stage makes the service NOT_SERVING (and stops the watchdog) until it moves again.
        """
        assert self.health is not None
        while True:
            stuck = stalled(self.stages, self.clock.monotonic())
            if stuck and self.health.state == ServiceState.SERVING:
                await self.health.set_not_serving("stalled: " + "; ".join(stuck))
            elif not stuck and self.health.state == ServiceState.NOT_SERVING and self.health.reason.startswith(
                "stalled"
            ):
                # the thermal verdict decides what follows a stall: a GPU lost while its reads hung was SERVING
                # for a second between the two (held-out review, session 19)
                action, why = health_action(self.thermal.snapshot())
                if action in (HealthAction.PAUSE, HealthAction.STOP):
                    await self.health.set_not_serving(why)
                else:
                    await self.health.set_serving()
            await asyncio.sleep(0.5)

    def _heartbeat(self) -> float:
        """Now while every stage progresses; never fresh after a stall, a lost GPU or a dead engine."""
        if self.thermal_loop.stopped or self.batcher.dead is not None:
            return -math.inf
        if stalled(self.stages, self.clock.monotonic()):
            return -math.inf
        return self.batcher.heartbeat

    def _engine_dead(self, error: Exception) -> None:
        """The engine cannot run another batch: NOT_SERVING, and :func:`serve` ends the process to be restarted.

        Waiting for the watchdog to notice left the service down for up to WatchdogSec (30 s) before systemd
        restarted it (ops review, session 14); an exit is restarted after RestartSec (Restart=on-failure).
        """
        loop = self._loop
        if loop is None:
            return
        health = self.health
        reason = f"engine dead: {error}"

        async def fail() -> None:
            if health is not None:
                await health.set_not_serving(reason)
            if self.fatal is None:
                self.fatal = reason
                self.fatal_event.set()

        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(fail()))

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain.

        STOPPING=1, NOT_SERVING, refuse new work, finish in-flight work within grace, answer the rest UNAVAILABLE (never
        CANCELLED), stop. Stuck workers are killed, so this returns within about grace.
        """
        grace = self.config.server.grace_s if grace_s is None else grace_s
        if self.health is not None:
            await self.health.set_draining()  # new calls are refused at the request path's door from here on
        # calls already inside it go on to the workers and the inbox: refused there, requests that arrived before the
        # SIGTERM were answered DRAINING with 9.9 s of the grace left (held-out review, session 19)
        finished = await self.path.wait_idle(max(0.0, grace - 0.5))
        self.batcher.stop_accepting()
        if not finished:
            left = self.path.fail_all(Unavailable(
                f"the service is shutting down and this request did not finish within the grace period "
                f"(server.grace_s = {grace})", reason="DRAINING"))
            log.warning("shutdown: %d request(s) answered UNAVAILABLE after the grace period", left)
            await self.path.wait_idle(0.5)  # let their handlers send the replies
        if self.server is not None:
            await self.server.stop(0.5)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # a task that died was reported already
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.pool.stop, 1.0)
        await loop.run_in_executor(None, self.batcher.stop, 2.0)
        if not self.batcher.engine_thread_alive:  # the engine is only ever touched by its own thread
            self.engine.close()
        self.thermal_loop.close()
        self.metrics.close()
        self.arena.close()

    def close(self) -> None:
        """Release what the constructor took (for an App that was never started)."""
        self.arena.close()


def served_pipelines(config: Config, manifest: Manifest) -> tuple[dict[str, Pipeline], str]:
    """The pipelines for ``manifest``'s model in ``pipelines_dir``, and the default one (``appliance doctor`` too).

    Raises ConfigError (exit 78) when the default is not among them, naming ``model.pipelines_dir`` when there is
    none for the model at all: a restart cannot fix either.
    """
    pipelines = {name: p for name, p in load_pipelines(config.pipelines_dir(), config.models_dir()).items()
                 if p.model == manifest.name}
    default = config.model.default_pipeline or manifest.name
    if default not in pipelines:
        key = "model.default_pipeline" if pipelines else "model.pipelines_dir"
        raise ConfigError(f"default pipeline {default!r} not found in {config.pipelines_dir()} for model "
                          f"{manifest.name!r} (config key {key}; pipelines there for this model: "
                          f"{', '.join(sorted(pipelines)) or 'none'})")
    return pipelines, default


def preprocess_workers(config: Config) -> int:
    """Worker processes: ``batcher.preprocess_workers``, or (0 = auto) the cores the engine leaves, at least 2."""
    if config.batcher.preprocess_workers:
        return config.batcher.preprocess_workers
    return max(2, _cores_left_by_engine(config))


def _cores_left_by_engine(config: Config) -> int:
    """The cores this process may use beyond the engine's own intra-op threads (may be 0 or less)."""
    return usable_cores() - config.engine.intra_op_threads
