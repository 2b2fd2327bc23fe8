"""Configuration: frozen dataclasses loaded from TOML once at startup. Errors name the key.

Every section and key is optional; defaults are the embedded default (CPU engine, bundled model, no thermal
sensor when there is no GPU). Unknown keys are errors, so a typo never silently falls back to a default.
Every numeric key has a range (:data:`RANGES`, documented in ``docs/operations.md``) and every address is
parsed at load (:mod:`appliance.serving.listen`), so nonsense is refused before anything binds.
See ``systemd/appliance.toml.example`` for a documented file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.errors import ConfigError

__all__ = [
    "Config",
    "DicomConfig",
    "EngineConfig",
    "MetricsConfig",
    "ModelConfig",
    "RANGES",
    "AccessConfig",
    "LoggingConfig",
    "ServerConfig",
    "ThermalSection",
    "BatcherConfig",
    "WorkersConfig",
    "TlsConfig",
    "default_home",
    "load_config",
]


def default_home() -> Path:
    """Return the directory holding ``models/`` and ``pipelines/``: ``$APPLIANCE_HOME``, else the checkout."""
    env = os.environ.get("APPLIANCE_HOME")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class BatcherConfig:
    """The batcher's knobs (``[batcher]`` in the config file)."""

    max_wait_s: float = 0.005  # how long the oldest ready item may wait for partners while the engine idles
    # Slots in the inbox. 64 frames = 8 batches of 8: at ~50 ms per CPU batch that is ~0.4 s of work, so a
    # full inbox still drains well inside an interactive client's deadline, while a series upload of a few
    # dozen slices is admitted whole. Each slot holds one model input (256 KiB at 1x256x256 float32).
    queue_capacity: int = 64
    overlap: bool = True  # preprocess in the worker processes while the engine runs; False = sequential (bench)
    # Preprocessing worker processes; 0 = auto: the cores left after the engine's intra-op threads, at least 2
    # (two, so one slow or hostile input never holds up every other request while it runs out its budget).
    preprocess_workers: int = 0


@dataclass(frozen=True)
class WorkersConfig:
    """``[workers]``: the supervised preprocessing worker processes (docs/robustness.md)."""

    step_timeout_s: float = 10.0  # budget of one parse or one frame decode; past it the worker is killed
    memory_bytes: int = 2 << 30  # address space a worker may add after start-up (RLIMIT_AS); over -> MemoryError
    recycle_rss_bytes: int = 1 << 30  # a worker whose RSS passes this after a request is replaced
    start_timeout_s: float = 60.0  # a new worker must report ready within this
    # Niceness added to workers: the engine thread (the critical path) and the event loop get the CPU first.
    # Measured on a quiet 2-core box, mixed workload, 16 clients: +5 gave 96.3 req/s, 0 gave 93.7-94.6.
    nice: int = 5


@dataclass(frozen=True)
class ServerConfig:
    """``[server]``: where and how the gRPC daemon listens."""

    # Plaintext addresses: loopback TCP or unix:PATH only (anything else needs [tls] listen). A relative unix
    # path lives in the runtime directory (appliance.serving.listen.runtime_dir: $RUNTIME_DIRECTORY under systemd).
    listen: tuple[str, ...] = ("127.0.0.1:50051", "unix:grpc.sock")
    socket_group: str = ""  # group of the unix sockets (mode 0660); "" = our primary group
    max_message_bytes: int = 64 << 20  # largest accepted request (DoS bound); larger -> RESOURCE_EXHAUSTED
    reflection: bool | None = None  # gRPC server reflection; unset = on without TLS, off with [tls] listen
    grace_s: float = 10.0  # on SIGTERM: finish in-flight work within this, then exit 0
    # Deadline applied when the client sends none. Never "forever": a wedged stage must not hold a request.
    default_deadline_s: float = 30.0
    inflight_bytes: int = 256 << 20  # DICOM bytes of all unanswered requests together; over -> RESOURCE_EXHAUSTED
    max_concurrent_rpcs: int = 1024  # gRPC's own cap on concurrent RPCs (health included); a safety net
    stall_s: float = 15.0  # a stage with work and no progress for this long: NOT_SERVING, watchdog withheld


@dataclass(frozen=True)
class ModelConfig:
    """``[model]``: which model to serve."""

    name: str = "ct-nodule"  # directory under models_dir
    precision: str = ""  # artifact precision; "" = the manifest's default_precision
    models_dir: str = ""  # "" = <home>/models
    pipelines_dir: str = ""  # "" = <home>/pipelines
    default_pipeline: str = ""  # "" = the pipeline named like the model


@dataclass(frozen=True)
class EngineConfig:
    """``[engine]``: the backend and its threads."""

    backend: str = "auto"  # "auto", "tensorrt", "onnxruntime-tensorrt", "onnxruntime-cuda", "onnxruntime-cpu", "fake"
    intra_op_threads: int = 1  # cores for the engine; the rest decode DICOM
    allow_spinning: bool = True  # ORT intra-op spinning
    warmup_runs: int = 3
    options: dict[str, Any] = field(default_factory=dict)  # backend-specific: checked against Engine.OPTIONS
    cache_dir: str = ""  # engine/timing cache; "" = $CACHE_DIRECTORY under systemd, else none
    min_free_bytes: int = 256 << 20  # refuse to start when the cache file system has less free space


@dataclass(frozen=True)
class DicomConfig:
    """``[dicom]``: input limits, checked before allocating."""

    max_pixels_per_frame: int = 4096 * 4096
    max_frames: int = 512
    max_decoded_bytes: int = 1 << 30
    max_inflated_bytes: int = 256 << 20  # a Deflated Explicit VR LE dataset, inflated
    max_items: int = 100_000  # sequence items in one dataset (a parse-time bomb bound)


@dataclass(frozen=True)
class ThermalSection:
    """``[thermal]``: the sensor and the governor (``[thermal.governor]`` maps onto ThermalConfig)."""

    sensor: str = "auto"  # "auto" (NVML if a GPU, else none), "nvml", "none", "sim"
    period_s: float = 1.0  # control period
    governor: dict[str, Any] = field(default_factory=dict)  # appliance.governor.ThermalConfig fields
    sim: dict[str, Any] = field(default_factory=dict)  # simulated plant parameters (sensor = "sim")


@dataclass(frozen=True)
class MetricsConfig:
    """``[metrics]``: the Prometheus endpoint."""

    listen: str = "127.0.0.1:9400"  # host:port of /metrics (port 0: any); "" = off
    window: int = 2048  # samples kept for percentiles
    # /metrics is plain HTTP: loopback only unless this is true (a pod scraped by its cluster's Prometheus).
    # Metrics carry counts and timings, never patient data (docs/security.md).
    allow_non_loopback: bool = False


@dataclass(frozen=True)
class TlsConfig:
    """``[tls]``: TLS listeners. Certificates are re-read when their files change (no restart)."""

    listen: tuple[str, ...] = ()  # addresses served over TLS, e.g. "0.0.0.0:50052"
    cert_file: str = ""  # server certificate chain (PEM)
    key_file: str = ""  # its private key (PEM)
    client_ca_file: str = ""  # CA bundle for client certificates; "" = no client certificates (TLS only)
    # with client_ca_file: refuse clients without a valid certificate. false = grpc asks for no client
    # certificate at all (plain TLS; nothing a client presents is verified), so no [access] subject lists.
    require_client_cert: bool = True


@dataclass(frozen=True)
class AccessConfig:
    """``[access]``: who may call what (appliance.serving.access). Unix-socket clients are trusted by file mode."""

    analyze_subjects: tuple[str, ...] = ()  # TLS client subjects (CN or full subject) that may Analyze
    status_subjects: tuple[str, ...] = ()  # TLS client subjects that may only read status and health
    loopback: str = "analyze"  # plaintext loopback TCP callers: "analyze", "status" or "none"


@dataclass(frozen=True)
class LoggingConfig:
    """``[logging]``: level, destination and the key that hashes UIDs in log lines."""

    level: str = "info"  # debug | info | warning | error
    journald: str = "auto"  # auto (when $JOURNAL_STREAM is set) | yes | no
    uid_key_file: str = ""  # 32-byte secret for hash_uid, created 0600 if missing; "" = random per start


@dataclass(frozen=True)
class Config:
    """The whole configuration."""

    server: ServerConfig = field(default_factory=ServerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    dicom: DicomConfig = field(default_factory=DicomConfig)
    thermal: ThermalSection = field(default_factory=ThermalSection)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    access: AccessConfig = field(default_factory=AccessConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def models_dir(self) -> Path:
        """The model repository directory."""
        return Path(self.model.models_dir) if self.model.models_dir else default_home() / "models"

    def pipelines_dir(self) -> Path:
        """The pipelines directory."""
        return Path(self.model.pipelines_dir) if self.model.pipelines_dir else default_home() / "pipelines"


def _coerce(value: Any, typ: Any, key: str) -> Any:
    origin = typing.get_origin(typ)
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"config key {key} must be a finite number, got {type(value).__name__} {value!r}")
        return float(value)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"config key {key} must be a list, got {type(value).__name__}")
        (inner, _ellipsis) = typing.get_args(typ)
        return tuple(_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict or typ is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key} must be a table")
        return dict(value)
    if isinstance(typ, types.UnionType):
        typ = typing.get_args(typ)[0]
    if typ in (int, str, bool) and (type(value) is not typ):
        raise ConfigError(f"config key {key} must be {typ.__name__}, got {type(value).__name__} {value!r}")
    return value


def _section(cls: type, raw: dict[str, Any], name: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"config key {name} must be a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        if key not in fields:
            raise ConfigError(f"unknown config key {name}.{key} (known: {', '.join(sorted(fields))})")
        kwargs[key] = _coerce(value, hints[key], f"{name}.{key}")
    return cls(**kwargs)


#: Every numeric key: (min, max) inclusive. docs/operations.md documents the same table; a test keeps every
#: numeric field of every section in here.
RANGES: dict[str, tuple[float, float]] = {
    # 2**31 - 1 is grpc's int32 option limit; the receive limit adds 1 MiB of envelope to this key.
    "server.max_message_bytes": (1024, (1 << 31) - 1 - (1 << 20)),
    # The unit's TimeoutStopSec (30 s) must be >= grace_s + 10 s of margin; see docs/operations.md.
    "server.grace_s": (0.0, 20.0),
    "server.default_deadline_s": (0.001, 3600.0),  # > 0: a wedged stage must never hold a request forever
    "server.inflight_bytes": (1024, 1 << 40),
    "server.max_concurrent_rpcs": (16, 1_000_000),
    "server.stall_s": (0.1, 3600.0),
    "workers.step_timeout_s": (0.1, 3600.0),
    "workers.memory_bytes": (64 << 20, 1 << 40),
    "workers.recycle_rss_bytes": (64 << 20, 1 << 40),
    "workers.start_timeout_s": (1.0, 3600.0),
    "workers.nice": (0, 19),
    "engine.intra_op_threads": (1, 256),
    "engine.warmup_runs": (0, 100),
    "engine.min_free_bytes": (0, 1 << 50),
    "batcher.max_wait_s": (0.0, 0.5),
    "batcher.queue_capacity": (1, 65536),
    "batcher.preprocess_workers": (0, 64),  # 0 = auto
    "dicom.max_pixels_per_frame": (1, 65535 * 65535),
    "dicom.max_frames": (1, 65535),
    "dicom.max_decoded_bytes": (1, 1 << 40),
    "dicom.max_inflated_bytes": (1, 1 << 40),
    "dicom.max_items": (1, 10_000_000),
    "thermal.period_s": (0.05, 60.0),
    "metrics.window": (1, 1_000_000),
}

_CHOICES: dict[str, tuple[str, ...]] = {
    "thermal.sensor": ("auto", "nvml", "none", "sim"),
    "access.loopback": ("analyze", "status", "none"),
    "logging.level": ("debug", "info", "warning", "error"),
    "logging.journald": ("auto", "yes", "no"),
}


def _check_ranges(cfg: Config) -> None:
    for f in dataclasses.fields(cfg):
        section = getattr(cfg, f.name)
        for g in dataclasses.fields(section):
            key, value = f"{f.name}.{g.name}", getattr(section, g.name)
            if key in _CHOICES and value not in _CHOICES[key]:
                raise ConfigError(f"config key {key} must be one of {', '.join(_CHOICES[key])}, got {value!r}")
            if key not in RANGES or isinstance(value, bool):
                continue
            lo, hi = RANGES[key]
            if not lo <= value <= hi:
                raise ConfigError(f"config key {key} = {value!r} is out of range [{lo:g}, {hi:g}]")


def _check_engine_options(cfg: Config) -> None:
    """Unknown ``[engine.options]`` keys are errors: each backend declares its options (Engine.OPTIONS)."""
    from appliance.engines import AUTO_ORDER, BACKENDS, declared_options

    backend = cfg.engine.backend
    if backend != "auto" and backend not in BACKENDS:
        raise ConfigError(f"config key engine.backend: unknown backend {backend!r}; known: auto, {', '.join(BACKENDS)}")
    names = AUTO_ORDER if backend == "auto" else (backend,)
    known: dict[str, str] = {}
    for name in names:
        known.update(declared_options(name))
    for key in cfg.engine.options:
        if key not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise ConfigError(f"unknown config key engine.options.{key} for backend {backend!r} (known: {allowed})")


def _validate(cfg: Config) -> None:
    from appliance.serving.listen import validate_listeners

    _check_ranges(cfg)
    _check_engine_options(cfg)
    validate_listeners(cfg)
    if cfg.server.inflight_bytes < cfg.server.max_message_bytes:
        raise ConfigError("config key server.inflight_bytes must be >= server.max_message_bytes")


def load_config(path: Path | str | None = None, overrides: dict[str, dict[str, Any]] | None = None) -> Config:
    """Load a TOML config (or the defaults when ``path`` is None), apply ``overrides`` and validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} not found") from None
        except PermissionError:
            raise ConfigError(f"config file {path} is not readable by uid {os.geteuid()} (permission denied)") from None
        except IsADirectoryError:
            raise ConfigError(f"config file {path} is a directory") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
        except OSError as e:
            raise ConfigError(f"config file {path} cannot be read: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path}: {e}") from e
    for section, values in (overrides or {}).items():
        raw.setdefault(section, {}).update(values)
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    hints = typing.get_type_hints(Config)
    kwargs = {}
    for name, value in raw.items():
        if name not in sections:
            raise ConfigError(f"unknown config section [{name}] (known: {', '.join(sorted(sections))})")
        kwargs[name] = _section(hints[name], value, name)
    cfg = Config(**kwargs)
    _validate(cfg)
    return cfg
