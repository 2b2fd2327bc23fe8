"""Build, cache and verify the fixed-shape TensorRT plan of a strongly typed ONNX artifact.

TensorRT is pinned to ``>=10.13,<11`` (:data:`TRT_RANGE`, docs/gpu.md) and only APIs TensorRT 11 keeps are
used: a strongly typed network (precision comes from the graph; no ``BuilderFlag`` precision flags),
name-based tensor queries, ``build_serialized_network``, ``set_memory_pool_limit``, the timing cache and the
progress monitor.

**Cache.** The key is the sha256 of :class:`PlanKey` (ONNX sha256, TensorRT version, GPU name and compute
capability, the fixed input shape, and the build flags). ``<cache>/<model>-<precision>-<key16>.plan`` has a
sidecar ``.json`` holding the key fields and the plan's own sha256. A plan is used only if its sidecar
matches the key, its bytes match the recorded sha256 and TensorRT deserializes it; anything else (stale,
truncated, edited, from another GPU or TensorRT) is rebuilt, never trusted. Timing caches are per TensorRT
version and GPU.

**Verification after every build and load** (:func:`verify_engine`): the engine's I/O tensor names, modes,
shapes and dtypes must equal the manifest's, and the engine inspector (``ProfilingVerbosity.DETAILED``) must
show INT4 weights for a W4A16 artifact and FP16 for any FP16-activation artifact: a silent FP32 build is an
:class:`~appliance.errors.EngineError`.

**Service manager.** While building, ``STATUS=`` carries the phase and step, and ``EXTEND_TIMEOUT_USEC`` is
re-sent every :data:`EXTEND_EVERY_S` so systemd's start timeout never fires during a long first build.

``appliance models build-engine`` (:func:`build_engine_main`) builds ahead of time.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from appliance.errors import BackendUnavailable, EngineError
from appliance.manifest import Artifact, Manifest

__all__ = [
    "EXTEND_EVERY_S",
    "TRT_RANGE",
    "BuildSettings",
    "PlanKey",
    "build_engine_main",
    "default_cache_dir",
    "ensure_plan",
    "import_tensorrt",
    "verify_engine",
    "version_problem",
]

log = logging.getLogger(__name__)

#: Supported TensorRT versions: ONNX Runtime GPU's TensorRT provider links TensorRT 10; 11 removed weak typing.
TRT_RANGE = ((10, 13), (11, 0))
#: Seconds between EXTEND_TIMEOUT_USEC messages while building (each extends by 3x this).
EXTEND_EVERY_S = 20.0

ProgressCallback = Callable[[str, int, int], None]  # (phase, step, steps)


def default_cache_dir() -> Path:
    """Where plans live: ``$APPLIANCE_ENGINE_CACHE``, systemd's ``$CACHE_DIRECTORY``, or ``~/.cache``."""
    if os.environ.get("APPLIANCE_ENGINE_CACHE"):
        return Path(os.environ["APPLIANCE_ENGINE_CACHE"])
    if os.environ.get("CACHE_DIRECTORY"):  # CacheDirectory= in the unit
        return Path(os.environ["CACHE_DIRECTORY"].split(":")[0]) / "engines"
    return Path.home() / ".cache" / "edge-appliance" / "engines"


def import_tensorrt() -> Any:
    """Import ``tensorrt`` (raises ImportError naming how to install it)."""
    try:
        import tensorrt
    except ImportError as e:
        raise ImportError(
            f"tensorrt is not installed: pip install 'tensorrt-cu13>=10.13,<11' --extra-index-url "
            f"https://pypi.nvidia.com (docs/gpu.md) ({e})"
        ) from e
    return tensorrt


def version_problem(version: str) -> str | None:
    """Return why this TensorRT version is unsupported, or None."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        return f"cannot parse the TensorRT version {version!r}"
    v = (int(m.group(1)), int(m.group(2)))
    lo, hi = TRT_RANGE
    if not lo <= v < hi:
        return (f"TensorRT {version} is outside the supported range >={lo[0]}.{lo[1]},<{hi[0]} "
                "(pip install 'tensorrt-cu13>=10.13,<11': docs/gpu.md)")
    return None


@dataclass(frozen=True)
class BuildSettings:
    """Builder settings that change the plan (all part of the cache key)."""

    workspace_bytes: int = 2 << 30
    optimization_level: int = 3
    hardware_compatibility: str = "NONE"  # trt.HardwareCompatibilityLevel member name
    version_compatible: bool = False
    strongly_typed: bool = True


@dataclass(frozen=True)
class PlanKey:
    """Everything a plan depends on."""

    model: str
    precision: str
    onnx_sha256: str
    trt_version: str
    gpu_name: str
    compute_capability: str  # "8.9"
    input_shape: tuple[int, ...]
    settings: BuildSettings

    def digest(self) -> str:
        """The sha256 of the key's canonical JSON."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

    def plan_path(self, cache_dir: Path) -> Path:
        """``<cache>/<model>-<precision>-<digest16>.plan``."""
        return cache_dir / f"{self.model}-{self.precision}-{self.digest()[:16]}.plan"


@functools.cache
def _logger(trt: Any) -> Any:
    """One logger per process for the builder and every runtime: TensorRT warns when a second one differs."""
    return trt.Logger(trt.Logger.WARNING)


class _Heartbeat:
    """Sends STATUS and EXTEND_TIMEOUT_USEC while a build runs, from its own thread and on progress."""

    def __init__(self, notifier: Any, progress: ProgressCallback | None, what: str) -> None:
        self.notifier, self.progress, self.what = notifier, progress, what
        self.stop = threading.Event()
        self.phase = "starting"
        self.thread = threading.Thread(target=self._loop, name="trt-build-heartbeat", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._beat()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)

    def _beat(self) -> None:
        if self.notifier is not None:
            self.notifier.extend_timeout(3 * EXTEND_EVERY_S)
            self.notifier.status(f"building TensorRT engine {self.what}: {self.phase}")

    def _loop(self) -> None:
        while not self.stop.wait(EXTEND_EVERY_S):
            self._beat()

    def on_progress(self, phase: str, step: int, steps: int) -> None:
        new_phase = not self.phase.startswith(phase)
        self.phase = f"{phase} {step}/{steps}" if steps else phase
        if new_phase:  # STATUS on each new phase; the thread re-sends the current step every EXTEND_EVERY_S
            self._beat()
        if self.progress is not None:
            self.progress(phase, step, steps)


def _progress_monitor(trt: Any, heartbeat: _Heartbeat) -> Any:
    """An ``IProgressMonitor`` forwarding phases and steps to ``heartbeat`` (never cancels)."""

    class Monitor(trt.IProgressMonitor):  # type: ignore[misc]  # trt: the real or fake module, chosen at run time
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.steps: dict[str, int] = {}

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            self.steps[phase_name] = num_steps
            heartbeat.on_progress(phase_name, 0, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            heartbeat.on_progress(phase_name, step + 1, self.steps.get(phase_name, 0))
            return True

        def phase_finish(self, phase_name: str) -> None:
            heartbeat.on_progress(phase_name, self.steps.get(phase_name, 0), self.steps.get(phase_name, 0))

    return Monitor()


def _build(trt: Any, onnx_path: Path, key: PlanKey, timing_path: Path, notifier: Any,
           progress: ProgressCallback | None) -> bytes:
    """Build a serialized plan (strongly typed, fixed shape) and update the timing cache."""
    logger = _logger(trt)
    builder = trt.Builder(logger)
    flags = 0
    if key.settings.strongly_typed:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"TensorRT could not parse {onnx_path.name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, key.settings.workspace_bytes)
    config.builder_optimization_level = key.settings.optimization_level
    config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, key.settings.hardware_compatibility)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if key.settings.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    previous = timing_path.read_bytes() if timing_path.is_file() else b""
    cache = config.create_timing_cache(previous)
    if not config.set_timing_cache(cache, False):
        log.warning("timing cache %s does not match this TensorRT/GPU; starting a new one", timing_path)
        config.set_timing_cache(config.create_timing_cache(b""), False)
    with _Heartbeat(notifier, progress, f"{key.model} {key.precision}") as heartbeat:
        monitor = _progress_monitor(trt, heartbeat)  # kept referenced here for the whole build
        config.progress_monitor = monitor
        t0 = time.monotonic()
        plan = builder.build_serialized_network(network, config)
        seconds = time.monotonic() - t0
    if plan is None:
        raise EngineError(f"TensorRT failed to build {onnx_path.name} (see the TensorRT log above)")
    _atomic_write(timing_path, bytes(config.get_timing_cache().serialize()))
    log.info("built TensorRT plan for %s %s in %.1f s", key.model, key.precision, seconds)
    return bytes(plan)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _dtype_name(trt: Any, dtype: Any) -> str:
    return {trt.DataType.FLOAT: "float32", trt.DataType.HALF: "float16"}.get(dtype, str(dtype))


def verify_engine(trt: Any, engine: Any, manifest: Manifest, artifact: Artifact) -> dict[str, Any]:
    """Check I/O against the manifest and precision via the inspector; return what was found.

    Raises:
        EngineError: on any mismatch, or when the plan has no INT4 (W4A16) / no FP16 layers (a silent FP32 build).
    """
    expected = {manifest.input.name: ("INPUT", tuple(manifest.input.shape), manifest.input.dtype)}
    for out in manifest.outputs:
        expected[out.name] = ("OUTPUT", tuple(out.shape), "float32")
    found = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        mode = "INPUT" if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else "OUTPUT"
        found[name] = (mode, tuple(engine.get_tensor_shape(name)), _dtype_name(trt, engine.get_tensor_dtype(name)))
    if found != expected:
        raise EngineError(f"TensorRT engine I/O {found} does not match the manifest {expected}")
    info = _type_text(engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    counts = {
        "int4": len(re.findall(r"\bint4\b|kINT4", info, re.IGNORECASE)),
        "fp16": len(re.findall(r"\bfp16\b|\bhalf\b|kHALF", info, re.IGNORECASE)),
        "fp32": len(re.findall(r"\bfp32\b|\bfloat\b|kFLOAT", info, re.IGNORECASE)),
    }
    if artifact.precision in ("w4a16", "int4") and counts["int4"] == 0:
        raise EngineError(f"TensorRT engine for {artifact.path.name} has no INT4 weights: a silent FP32/FP16 build "
                          f"(inspector counts {counts})")
    if artifact.precision in ("w4a16", "fp16") and counts["fp16"] == 0:
        raise EngineError(f"TensorRT engine for {artifact.path.name} has no FP16 layers: a silent FP32 build "
                          f"(inspector counts {counts})")
    return {"io": {k: list(v) for k, v in found.items()}, "inspector_counts": counts}


def _type_text(info: str) -> str:
    """The inspector JSON's values without layer/tensor names (so a name like "fp16_cast" counts for nothing).

    Precision shows in fields such as ``"Format/Datatype": "Row major linear FP16 format"``.
    """
    try:
        data = json.loads(info)
    except ValueError:
        return info
    parts: list[str] = []

    def walk(node: Any, key: str = "") -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif key not in ("Name", "Bindings") and isinstance(node, str):
            parts.append(node)

    walk(data)
    return "\n".join(parts)


def ensure_plan(trt: Any, manifest: Manifest, artifact: Artifact, device: Any, *, cache_dir: Path,
                settings: BuildSettings | None = None, notifier: Any = None, progress: ProgressCallback | None = None,
                force: bool = False) -> tuple[Any, dict[str, Any]]:
    """Return a verified deserialized engine for ``artifact`` on this GPU, building it if needed.

    Args:
        trt: the ``tensorrt`` module (or the fake).
        manifest: the model manifest.
        artifact: a strongly typed artifact (``w4a16`` or ``fp16``).
        device: :class:`~appliance.engines.cuda.DeviceInfo` of the GPU.
        cache_dir: where plans, sidecars and timing caches live.
        settings: builder settings (default :class:`BuildSettings`).
        notifier: an :class:`~appliance.serving.notify.Notifier` for STATUS/EXTEND_TIMEOUT_USEC while building.
        progress: called with (phase, step, steps) during a build.
        force: rebuild even if a valid plan exists.

    Returns:
        (engine, report) where report says whether the plan was built or loaded, why, and the verification.
    """
    artifact.verify()
    settings = settings or BuildSettings()
    cc = f"{device.compute_capability[0]}.{device.compute_capability[1]}"
    key = PlanKey(manifest.name, artifact.precision, artifact.sha256, trt.__version__, device.name, cc,
                  tuple(manifest.input.shape), settings)
    plan_path = key.plan_path(cache_dir)
    sidecar = plan_path.with_suffix(".json")
    timing = cache_dir / f"timing-trt{trt.__version__}-{re.sub(r'[^A-Za-z0-9]+', '_', device.name)}-sm{cc}.cache"
    runtime = trt.Runtime(_logger(trt))
    reason = "forced" if force else _plan_problem(plan_path, sidecar, key)
    refused = None if reason is not None else _refused(sidecar)
    if refused is not None:  # this plan failed verification when it was built: say so again, do not rebuild
        raise EngineError(f"{refused} (verdict cached in {sidecar}: delete it, or run `appliance models build-engine "
                          "--force`, to build again)")
    engine = None
    if reason is None:
        engine = runtime.deserialize_cuda_engine(plan_path.read_bytes())
        reason = None if engine is not None else "TensorRT could not deserialize the cached plan"
    built = reason is not None
    build_s = None
    if built:
        log.info("TensorRT plan %s: %s; building", plan_path.name, reason)
        t0 = time.monotonic()
        plan = _build(trt, artifact.path, key, timing, notifier, progress)
        build_s = round(time.monotonic() - t0, 1)
        _atomic_write(plan_path, plan)
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:
            raise EngineError(f"TensorRT could not deserialize the plan it just built for {artifact.path.name}")
    def record(checked: dict[str, Any]) -> None:
        if built:
            meta = {"key": asdict(key), "key_sha256": key.digest(), "plan_sha256": hashlib.sha256(plan).hexdigest(),
                    "build_s": build_s, "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **checked}
            _atomic_write(sidecar, (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode())

    try:
        checked = verify_engine(trt, engine, manifest, artifact)
    except EngineError as e:
        # the verdict is kept with the plan: without it a refused plan had no sidecar, so every start rebuilt it
        # (minutes on a GPU) only to refuse it again (GPU code review, session 19)
        record({"refused": str(e)})
        raise
    record(checked)
    return engine, {"plan": str(plan_path), "built": built, "reason": reason, "build_s": build_s,
                    "key_sha256": key.digest(), **checked}


def _refused(sidecar: Path) -> str | None:
    """Why the cached plan failed verification when it was built (None: it passed, or nothing is recorded)."""
    try:
        refused = json.loads(sidecar.read_text(encoding="utf-8")).get("refused")
    except (OSError, ValueError, AttributeError):
        return None
    return refused if isinstance(refused, str) else None


def _plan_problem(plan_path: Path, sidecar: Path, key: PlanKey) -> str | None:
    """Why the cached plan cannot be used (None: it can be deserialized and tried)."""
    if not plan_path.is_file():
        return "no cached plan"
    try:
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "the plan's sidecar JSON is missing or unreadable"
    if meta.get("key_sha256") != key.digest():
        return "the plan was built for another model/TensorRT/GPU/batch/flags"
    if hashlib.sha256(plan_path.read_bytes()).hexdigest() != meta.get("plan_sha256"):
        return "the plan's bytes do not match its sidecar (truncated or edited)"
    return None


def build_engine_main(argv: Sequence[str] | None = None) -> int:
    """``appliance models build-engine NAME``: build (or verify) the TensorRT plan on this GPU ahead of time."""
    ap = argparse.ArgumentParser(prog="appliance models build-engine", description=build_engine_main.__doc__)
    ap.add_argument("name", help="model name, e.g. ct-nodule")
    ap.add_argument("--precision", default="w4a16", help="artifact to build from (w4a16 or fp16)")
    ap.add_argument("--models-dir", type=Path, default=Path(__file__).resolve().parents[2] / "models")
    ap.add_argument("--cache-dir", type=Path, default=None, help="plan cache (default: see docs/gpu.md)")
    ap.add_argument("--workspace-mib", type=int, default=2048)
    ap.add_argument("--force", action="store_true", help="rebuild even if a valid plan is cached")
    args = ap.parse_args(argv)

    from appliance.engines.cuda import import_cudart, probe_device
    from appliance.errors import ApplianceError
    from appliance.manifest import load_manifest
    from appliance.serving.notify import SystemdNotifier

    try:
        trt = import_tensorrt()
        problem = version_problem(trt.__version__)
        if problem:
            raise BackendUnavailable(problem)
        device = probe_device(import_cudart())
        if not device.ok:
            raise BackendUnavailable(device.reason or "no CUDA device")
        manifest = load_manifest(args.models_dir / args.name / "model.toml")
        artifact = manifest.artifact(args.precision)

        def show(phase: str, step: int, steps: int) -> None:
            sys.stderr.write(f"\r{phase}: {step}/{steps}   " if steps else f"\r{phase}   ")

        _, report = ensure_plan(trt, manifest, artifact, device, cache_dir=args.cache_dir or default_cache_dir(),
                                settings=BuildSettings(workspace_bytes=args.workspace_mib << 20),
                                notifier=SystemdNotifier(), progress=show, force=args.force)
    except (ImportError, ApplianceError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stderr.write("\n")
    sys.stdout.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0
