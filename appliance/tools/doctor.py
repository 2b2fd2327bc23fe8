"""``appliance doctor``: a self-test an owner can run on the box.

Default checks (CPU is enough): Python, the onnxruntime installation (never onnxruntime and onnxruntime-gpu
together), engine backends and DICOM decoders (each with the reason it is unusable), the model manifest and
the sha256 of every artifact, one real batch through the CPU engine on synthetic slices, and the thermometer.

``--gpu``: the RTX self-test in :mod:`appliance.tools.doctor_gpu` (driver, NVML, GPU, TensorRT; the TensorRT plan
built or loaded and compared with the CPU; W4A16 vs FP16 latency and AUC; end-to-end p50/p99 through the
daemon with the GPU temperature). See docs/gpu.md.

``--thermal``: commissioning (appliance.thermal.commissioning): NVML latency and update period, step response and
safe blind duty, with the GPU engine as the load. ``--sim`` runs it against the simulated plant instead.

Exit code: 0 all checks pass, 1 a check failed, 3 (``EXIT_NO_GPU``) ``--gpu`` on a machine without a usable
NVIDIA GPU. ``--json`` prints every check (with ``--gpu``, the first is the environment: attach it to a bug
report).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["Check", "run_doctor"]


@dataclass
class Check:
    """One line of the report."""

    name: str
    ok: bool
    detail: str
    data: dict[str, Any] | None = None


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_runtime() -> list[Check]:
    """Python and the onnxruntime distributions."""
    checks = [Check("python", sys.version_info >= (3, 11), platform.python_version())]
    cpu, gpu = _installed("onnxruntime"), _installed("onnxruntime-gpu")
    if cpu and gpu:
        checks.append(
            Check(
                "onnxruntime",
                False,
                f"onnxruntime {cpu} and onnxruntime-gpu {gpu} are both installed: "
                "they shadow each other and only CPU providers remain; uninstall one",
            )
        )
    elif not (cpu or gpu):
        checks.append(Check("onnxruntime", False, "not installed: pip install 'edge-appliance[cpu]' (or [gpu])"))
    else:
        checks.append(Check("onnxruntime", True, f"onnxruntime{'-gpu' if gpu else ''} {cpu or gpu}"))
    return checks


def check_backends() -> list[Check]:
    """Engine backends and DICOM decoders."""
    from appliance.dicom import decoder_report
    from appliance.engines import backend_report

    checks = []
    for name, why in backend_report().items():
        if name == "fake":
            continue
        # a missing GPU backend is information, not a failure, on a CPU box
        gpu_backend = name != "onnxruntime-cpu"
        checks.append(Check(f"engine {name}", why is None or gpu_backend, why or "available"))
    decoders = decoder_report()
    missing = {uid: info for uid, info in decoders.items() if not info.get("available")}
    detail = f"{len(decoders) - len(missing)}/{len(decoders)} transfer syntaxes decodable"
    if missing:
        detail += "; missing: " + "; ".join(f"{i.get('name', uid)}: {i.get('missing')}" for uid, i in missing.items())
    checks.append(Check("dicom decoders", not missing, detail, {"decoders": decoders}))
    try:  # refuses 8-bit JPEG frames that lost data (appliance/dicom/jpegcheck.py): without it they cannot decode
        import simplejpeg

        checks.append(Check("strict JPEG check", True, f"simplejpeg {simplejpeg.__version__}"))
    except ImportError as e:
        checks.append(Check("strict JPEG check", False, f"simplejpeg is not installed ({e}): 8-bit JPEG frames "
                            "cannot be decoded; pip install 'simplejpeg>=1.8'"))
    return checks


def _synthetic_batch(manifest: Any) -> tuple[np.ndarray, np.ndarray]:
    from appliance.tools import synthetic

    b = manifest.input.batch_size
    truths = [synthetic.generate_slice(1000 + i, nodule=bool(i % 2), size=512) for i in range(b)]
    batch = np.stack([synthetic.model_input(t, manifest) for t in truths]).astype(np.float32)
    return batch, np.array([t.has_nodule for t in truths])


def check_start_up(config: Any) -> Check:
    """What ``serve`` checks before it binds (cache directory, free space, UID key): the same errors, no start.

    Ops review, session 14: doctor passed configurations that serve then refused (an unwritable cache directory,
    too little free space), though operations.md says to run it before a restart.
    """
    from appliance.errors import ConfigError
    from appliance.serving.preflight import preflight

    try:
        preflight(config)
    except ConfigError as e:
        return Check("start-up checks", False, str(e))
    return Check("start-up checks", True, "cache directory, free space and UID key as serve needs them")


def check_configured_backend(config: Any) -> Check:
    """The configured ``engine.backend`` can run here (``auto`` always can: it falls back to the CPU)."""
    from appliance.engines import backend_report

    name = config.engine.backend
    if name in ("auto", "fake"):
        return Check("configured backend", True, f"engine.backend = {name!r}")
    why = backend_report().get(name, f"unknown backend {name!r}")
    return Check("configured backend", why is None, f"engine.backend = {name!r}: {why or 'available'}")


def check_pipelines(config: Any, manifest: Any) -> Check:
    """The pipelines for the model and the default one, as ``serve`` loads them."""
    from appliance.errors import ApplianceError
    from appliance.serving.app import served_pipelines

    try:
        pipelines, default = served_pipelines(config, manifest)
    except ApplianceError as e:
        return Check("pipelines", False, str(e))
    return Check("pipelines", True, f"{', '.join(sorted(pipelines))} (default {default})")


def check_model(config: Any) -> tuple[list[Check], Any]:
    """Manifest, artifact integrity, and one batch on the CPU engine."""
    from appliance.batching.inbox import check_capacity
    from appliance.engines.onnxruntime import OrtCpuEngine
    from appliance.errors import ApplianceError
    from appliance.manifest import load_manifest

    checks: list[Check] = []
    try:
        manifest = load_manifest(config.models_dir() / config.model.name / "model.toml")
    except ApplianceError as e:
        return [Check("model manifest", False, str(e))], None
    checks.append(
        Check("model manifest", True, f"{manifest.name} {manifest.version}, input {list(manifest.input.shape)}")
    )
    for precision, artifact in manifest.artifacts.items():
        try:
            artifact.verify()
            checks.append(
                Check(f"artifact {precision}", True, f"{artifact.path.name} sha256 ok ({artifact.size_bytes} B)")
            )
        except ApplianceError as e:
            checks.append(Check(f"artifact {precision}", False, str(e)))
    try:  # what serve refuses at start, refused here too (ops review, session 18: doctor passed both)
        artifact = manifest.configured_artifact(config.model.precision)
        check_capacity(config.batcher.queue_capacity, manifest.input.batch_size)
    except ApplianceError as e:
        checks.append(Check("model configuration", False, str(e)))
        return checks, manifest
    if OrtCpuEngine.why_unavailable() is None:
        engine = OrtCpuEngine(manifest, artifact, {"intra_op_threads": config.engine.intra_op_threads})
        try:
            engine.load()
            batch, labels = _synthetic_batch(manifest)
            engine.run(batch)
            t0 = time.perf_counter()
            outputs = engine.run(batch)
            ms = (time.perf_counter() - t0) * 1000
            finite = all(np.isfinite(v).all() for v in outputs.values())
            checks.append(
                Check(
                    "cpu engine",
                    finite,
                    f"{artifact.precision} on {engine.backend}: {ms:.1f} ms per batch "
                    f"of {manifest.input.batch_size}, outputs {'finite' if finite else 'NOT finite'}",
                )
            )
        except ApplianceError as e:
            checks.append(Check("cpu engine", False, str(e)))
    return checks, manifest


def check_thermometer(sensor: str = "auto") -> Check:
    """Which thermometer "auto" finds; with ``thermal.sensor = "nvml"``, a failure when NVML has no reading."""
    from appliance.serving.thermal_loop import nvml_missing
    from appliance.thermal.source import make_thermometer

    therm = make_thermometer("auto")
    try:
        if not therm.available:
            if sensor == "nvml":  # serve refuses to start (exit 1)
                return Check("thermometer", False, nvml_missing(therm.why_unavailable))
            return Check("thermometer", True, f"none ({therm.why_unavailable}): governor disabled")
        reading = therm.read()
        return Check("thermometer", reading.error is None, f"{therm.name}: {reading.temp_c} °C, {reading.power_w} W")
    finally:
        therm.close()


class _EngineLoad:
    """``load(duty)`` for commissioning: runs real batches on a thread, paced to the duty."""

    def __init__(self, engine: Any, batch: np.ndarray) -> None:
        from appliance.batching.batcher import Pacer
        from appliance.clock import RealClock

        self.engine, self.batch = engine, batch
        self.pacer = Pacer(RealClock())
        self.pacer.set_duty(0.0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def __call__(self, duty: float) -> None:
        self.pacer.set_duty(duty)

    def _loop(self) -> None:
        cost = 0.01
        while not self.stop.is_set():
            wait = self.pacer.delay(cost)
            if wait > 0:
                self.stop.wait(min(wait, 0.05))
                continue
            t0 = time.perf_counter()
            self.engine.run(self.batch)
            cost = time.perf_counter() - t0
            self.pacer.consume(cost)


def check_thermal(config: Any, manifest: Any, sim: bool, quick: bool) -> Check:
    """Commissioning against NVML (with the GPU engine as load) or the simulated plant."""
    from appliance.clock import RealClock
    from appliance.thermal.commissioning import commission
    from appliance.thermal.simulated import SimulatedThermometer
    from appliance.thermal.source import make_thermometer

    if sim:  # simulated time: the plant advances as the procedure sleeps, so this runs in seconds
        from appliance.clock import ManualClock

        sim_clock = ManualClock()
        therm = make_thermometer("sim", clock=sim_clock)
        assert isinstance(therm, SimulatedThermometer)
        report = commission(therm, sim_clock, therm.note_busy, quick=quick)
        return Check("thermal commissioning (simulated)", bool(report.get("ok")), json.dumps(report), report)
    clock = RealClock()
    therm = make_thermometer("auto")
    if not therm.available:
        return Check("thermal commissioning", False, f"needs an NVIDIA GPU: {therm.why_unavailable}")
    from appliance.engines.onnxruntime import OrtCudaEngine

    engine = OrtCudaEngine(manifest, manifest.configured_artifact(config.model.precision), {})
    engine.load()
    batch, _ = _synthetic_batch(manifest)
    load = _EngineLoad(engine, batch)
    try:
        report = commission(therm, clock, load, quick=quick)
    finally:
        load.stop.set()
        therm.close()
    return Check("thermal commissioning", bool(report.get("ok")), json.dumps(report), report)


def run_doctor(args: argparse.Namespace) -> int:
    """Run the checks the flags ask for; print them; return 0 if all pass."""
    from appliance.config import load_config
    from appliance.errors import ConfigError, ManifestError

    try:
        config = load_config(args.config)
    except (ConfigError, ManifestError) as e:  # the one line serve would print, and its exit status
        print(f"[FAIL] configuration: {e}")
        return 78
    checks = check_runtime() + check_backends()
    checks.append(check_configured_backend(config))
    checks.append(check_start_up(config))
    model_checks, manifest = check_model(config)
    checks += model_checks
    if manifest is not None:
        checks.append(check_pipelines(config, manifest))
    checks.append(check_thermometer(config.thermal.sensor))
    no_gpu = False
    if args.gpu:
        from appliance.tools.doctor_gpu import check_gpu

        gpu_checks, no_gpu = check_gpu(config, manifest, e2e=not getattr(args, "no_e2e", False))
        checks += gpu_checks
    if args.thermal:
        checks.append(check_thermal(config, manifest, getattr(args, "sim", False), getattr(args, "quick", False)))
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2, default=str))
    else:
        for c in checks:
            print(
                f"[{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail if len(c.detail) < 300 else c.detail[:300] + '...'}"
            )
    if no_gpu:
        from appliance.tools.doctor_gpu import EXIT_NO_GPU

        if not args.json:
            print("doctor --gpu: this machine has no usable NVIDIA GPU (see the 'gpu' line); "
                  f"exit status {EXIT_NO_GPU}")
        return EXIT_NO_GPU
    return 0 if all(c.ok for c in checks) else 1
