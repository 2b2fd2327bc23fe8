"""Configuration: frozen, typed msgspec Structs loaded from TOML once at startup. Errors name the full key path.

The sections are :class:`appliance.schema.Schema` tables read by the shared loader (:mod:`appliance.schema`).
Every section and key is optional; defaults are the embedded default (CPU engine, bundled model, no thermal
sensor when there is no GPU). Unknown keys are errors, so a typo never silently falls back to a default.
Every numeric key has a range (:data:`RANGES`, documented in ``docs/operations.md``) and every address is
parsed at load (:mod:`appliance.serving.listen`), so nonsense is refused before anything binds.
See ``systemd/appliance.toml.example`` for a documented file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from appliance.engines.base import EngineOptionsSchema
from appliance.errors import ConfigError
from appliance.schema import Schema, convert, numeric_ranges, read_toml
from appliance.thermal.governor import ThermalConfig
from appliance.thermal.plant import SensorParams

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
    "ThermalSimSection",
    "BatcherConfig",
    "WorkersConfig",
    "TlsConfig",
    "default_home",
    "load_config",
]

_GRPC_INT32 = (1 << 31) - 1


def default_home() -> Path:
    """Return the directory holding ``models/`` and ``pipelines/``: ``$APPLIANCE_HOME``, else the checkout."""
    env = os.environ.get("APPLIANCE_HOME")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent


def _range(lo: float, hi: float) -> Meta:
    return Meta(ge=lo, le=hi)


class BatcherConfig(Schema, frozen=True):
    """The batcher's knobs (``[batcher]`` in the config file)."""

    # How long the oldest ready item may wait for partners while the engine idles (longer would hold a lone
    # request for nothing).
    max_wait_s: Annotated[float, _range(0.0, 0.5)] = 0.005
    # Slots in the inbox. 64 frames = 8 batches of 8: at ~50 ms per CPU batch that is ~0.4 s of work, so a
    # full inbox still drains well inside an interactive client's deadline, while a series upload of a few
    # dozen slices is admitted whole. Each slot holds one model input (256 KiB at 1x256x256 float32).
    queue_capacity: Annotated[int, _range(1, 65536)] = 64
    overlap: bool = True  # preprocess in the worker processes while the engine runs; False = sequential (bench)
    # Preprocessing worker processes; 0 = auto: the cores left after the engine's intra-op threads, at least 2
    # (two, so one slow or hostile input never holds up every other request while it runs out its budget).
    preprocess_workers: Annotated[int, _range(0, 64)] = 0


class WorkersConfig(Schema, frozen=True):
    """``[workers]``: the supervised preprocessing worker processes (docs/robustness.md)."""

    # Budget of one parse or one frame decode; past it the worker is killed.
    step_timeout_s: Annotated[float, _range(0.1, 3600.0)] = 10.0
    # Address space a worker may add after start-up (RLIMIT_AS); over -> MemoryError.
    memory_bytes: Annotated[int, _range(64 << 20, 1 << 40)] = 2 << 30
    # A worker whose RSS passes this after a request is replaced.
    recycle_rss_bytes: Annotated[int, _range(64 << 20, 1 << 40)] = 1 << 30
    start_timeout_s: Annotated[float, _range(1.0, 3600.0)] = 60.0  # a new worker must report ready within this
    # Niceness added to workers: the engine thread (the critical path) and the event loop get the CPU as soon as
    # they wake, the workers what is left. 10 against 5, 16 clients on 2 cores: +3-4 % req/s, the server's share
    # of the cores 1.82 -> 1.85 (docs/performance.md, "Where the idle core goes").
    nice: Annotated[int, _range(0, 19)] = 10
    # Free heap each worker (and the daemon) keeps for reuse instead of returning it to the kernel (glibc
    # malloc thresholds, appliance.heap); 0 = glibc's defaults, which cost ~600 page faults per 512x512 slice.
    heap_keep_bytes: Annotated[int, _range(0, 1 << 30)] = 64 << 20
    # Shared-memory buffer per worker that carries a request's DICOM file to it (the daemon writes, the worker
    # copies it out and zeroes it); a larger file goes through the worker's pipe. 0 = always the pipe.
    input_buffer_bytes: Annotated[int, _range(0, 1 << 30)] = 4 << 20
    # Most threads one JPEG 2000 frame may decode on (OpenJPEG's code-block threads). A frame gets more than one
    # only when the other cores are idle: no other worker busy, no job waiting, no batch computing on the host's
    # cores (docs/dicom.md, "JPEG 2000 on idle cores"). 0 = the cores the daemon may use; 1 = always one.
    decoder_threads: Annotated[int, _range(0, 256)] = 0


class ServerConfig(Schema, frozen=True):
    """``[server]``: where and how the gRPC daemon listens."""

    # Plaintext addresses: loopback TCP or unix:PATH only (anything else needs [tls] listen). A relative unix
    # path lives in the runtime directory (appliance.serving.listen.runtime_dir: $RUNTIME_DIRECTORY under systemd).
    listen: tuple[str, ...] = ("127.0.0.1:50051", "unix:grpc.sock")
    socket_group: str = ""  # group of the unix sockets (mode 0660); "" = our primary group
    # Largest accepted request (DoS bound); larger -> RESOURCE_EXHAUSTED. 2**31 - 1 is grpc's int32 option
    # limit; the receive limit adds 1 MiB of envelope to this key.
    max_message_bytes: Annotated[int, _range(1024, _GRPC_INT32 - (1 << 20))] = 64 << 20
    reflection: bool | None = None  # gRPC server reflection; unset = on without TLS, off with [tls] listen
    # On SIGTERM: finish in-flight work within this, then exit 0. The unit's TimeoutStopSec (30 s) must be
    # >= grace_s + 10 s of margin; see docs/operations.md.
    grace_s: Annotated[float, _range(0.0, 20.0)] = 10.0
    # Deadline applied when the client sends none. Never "forever" (> 0): a wedged stage must not hold a
    # request.
    default_deadline_s: Annotated[float, _range(0.001, 3600.0)] = 30.0
    # DICOM bytes of all unanswered requests together; over -> RESOURCE_EXHAUSTED.
    inflight_bytes: Annotated[int, _range(1024, 1 << 40)] = 256 << 20
    # gRPC's own cap on concurrent RPCs (health included); a safety net.
    max_concurrent_rpcs: Annotated[int, _range(16, 1_000_000)] = 1024
    # A stage with work and no progress for this long: NOT_SERVING, watchdog withheld.
    stall_s: Annotated[float, _range(0.1, 3600.0)] = 15.0


class ModelConfig(Schema, frozen=True):
    """``[model]``: which model to serve."""

    name: str = "ct-nodule"  # directory under models_dir
    precision: str = ""  # artifact precision; "" = the manifest's default_precision
    models_dir: str = ""  # "" = <home>/models
    pipelines_dir: str = ""  # "" = <home>/pipelines
    default_pipeline: str = ""  # "" = the pipeline named like the model


class EngineConfig(Schema, frozen=True):
    """``[engine]``: the backend and its threads.

    ``options`` (``[engine.options]``) is typed by the backend: the selected backend's ``Engine.OPTIONS``
    schema (with ``backend = "auto"``, the options of every backend it may pick).
    """

    backend: str = "auto"  # "auto", "tensorrt", "onnxruntime-tensorrt", "onnxruntime-cuda", "onnxruntime-cpu", "fake"
    intra_op_threads: Annotated[int, _range(1, 256)] = 1  # cores for the engine; the rest decode DICOM
    allow_spinning: bool = True  # ORT intra-op spinning
    # Intra-op threads for a batch launched while no DICOM is being preprocessed and either no frame is expected
    # during it or a whole further batch already waits for the engine (the engine then has the idle cores to
    # itself: one batch of 8 on this model, 42 -> 32 ms on 2 cores);
    # 0 = the cores this process may use, 1 = never (docs/performance.md, "Burst threads"). CPU backend only;
    # outputs are bit-identical.
    burst_threads: Annotated[int, _range(0, 256)] = 0
    warmup_runs: Annotated[int, _range(0, 100)] = 3
    # Backend-specific, typed by the backend's Engine.OPTIONS (filled in by load_config).
    options: EngineOptionsSchema = msgspec.field(default_factory=EngineOptionsSchema)
    cache_dir: str = ""  # engine/timing cache; "" = $CACHE_DIRECTORY under systemd, else none
    # Refuse to start when the cache file system has less free space.
    min_free_bytes: Annotated[int, _range(0, 1 << 50)] = 256 << 20


class DicomConfig(Schema, frozen=True):
    """``[dicom]``: input limits, checked before allocating."""

    max_pixels_per_frame: Annotated[int, _range(1, 65535 * 65535)] = 4096 * 4096
    max_frames: Annotated[int, _range(1, 65535)] = 512
    max_decoded_bytes: Annotated[int, _range(1, 1 << 40)] = 1 << 30
    max_inflated_bytes: Annotated[int, _range(1, 1 << 40)] = 256 << 20  # a Deflated Explicit VR LE dataset, inflated
    # Sequence items in one dataset (a parse-time bomb bound).
    max_items: Annotated[int, _range(1, 10_000_000)] = 100_000
    # Data elements in one dataset, all levels (a parse-time bomb bound: 4 million empty ones, 53 KB deflated, took
    # 10 s to parse; a 512-frame enhanced CT holds some tens of thousands).
    max_elements: Annotated[int, _range(1, 100_000_000)] = 250_000
    # Compressed pixel data decoding to more than 64 MiB may decode to at most this many times its encoded size.
    max_decode_ratio: Annotated[int, _range(1, 1 << 30)] = 1000


class ThermalSimSection(Schema, frozen=True):
    """``[thermal.sim]``: the simulated GPU behind ``sensor = "sim"`` (appliance.thermal.simulated)."""

    plant: Literal["5090", "4090", "pro6000maxq"] = "5090"  # appliance.thermal.plant.PRESETS
    ambient_c: Annotated[float, _range(-20.0, 60.0)] = 25.0  # room temperature, °C
    # The simulated NVML sensor (appliance.thermal.plant.SensorParams): delay behind the die, s; integer
    # quantisation; Gaussian noise before quantisation, °C.
    delay_s: Annotated[float, _range(0.0, 30.0)] = SensorParams.delay_s
    quantize: Literal["floor", "round"] = "floor"
    noise_c: Annotated[float, _range(0.0, 10.0)] = SensorParams.noise_c

    def sensor_params(self) -> SensorParams:
        """The sensor part as the simulator's :class:`~appliance.thermal.plant.SensorParams`."""
        return SensorParams(delay_s=self.delay_s, quantize=self.quantize, noise_c=self.noise_c)


class ThermalSection(Schema, frozen=True):
    """``[thermal]``: the sensor, the governor (``[thermal.governor]``) and the simulated GPU (``[thermal.sim]``)."""

    sensor: Literal["auto", "nvml", "none", "sim"] = "auto"  # "auto": NVML if a GPU, else none
    period_s: Annotated[float, _range(0.05, 60.0)] = 1.0  # control period
    # What the governor learned, kept across restarts (docs/thermal.md, "Restarts"); "" = $STATE_DIRECTORY/
    # thermal-memory-gpu<N>.json (N: the NVML index watched) under systemd, else none.
    state_file: str = ""
    # appliance.thermal.governor.ThermalConfig, which checks its own values (unknown keys refused by name).
    governor: ThermalConfig = msgspec.field(default_factory=ThermalConfig)
    sim: ThermalSimSection = msgspec.field(default_factory=ThermalSimSection)  # used when sensor = "sim"


class MetricsConfig(Schema, frozen=True):
    """``[metrics]``: the Prometheus endpoint."""

    listen: str = "127.0.0.1:9400"  # host:port of /metrics (port 0: any); "" = off
    window: Annotated[int, _range(1, 1_000_000)] = 2048  # samples kept for percentiles
    # /metrics is plain HTTP: loopback only unless this is true (a pod scraped by its cluster's Prometheus).
    # Metrics carry counts and timings, never patient data (docs/security.md).
    allow_non_loopback: bool = False


class TlsConfig(Schema, frozen=True):
    """``[tls]``: TLS listeners. Certificates are re-read when their files change (no restart)."""

    listen: tuple[str, ...] = ()  # addresses served over TLS, e.g. "0.0.0.0:50052"
    cert_file: str = ""  # server certificate chain (PEM)
    key_file: str = ""  # its private key (PEM)
    client_ca_file: str = ""  # CA bundle for client certificates; "" = no client certificates (TLS only)
    # with client_ca_file: refuse clients without a valid certificate. false = grpc asks for no client
    # certificate at all (plain TLS; nothing a client presents is verified), so no [access] subject lists.
    require_client_cert: bool = True


class AccessConfig(Schema, frozen=True):
    """``[access]``: who may call what (appliance.serving.access). Unix-socket clients are trusted by file mode."""

    analyze_subjects: tuple[str, ...] = ()  # TLS client subjects (CN or full subject) that may Analyze
    status_subjects: tuple[str, ...] = ()  # TLS client subjects that may only read status and health
    loopback: Literal["analyze", "status", "none"] = "analyze"  # plaintext loopback TCP callers


class LoggingConfig(Schema, frozen=True):
    """``[logging]``: level, destination and the key that hashes UIDs in log lines."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    journald: Literal["auto", "yes", "no"] = "auto"  # auto: when $JOURNAL_STREAM is set
    uid_key_file: str = ""  # 32-byte secret for hash_uid, created 0600 if missing; "" = random per start


class Config(Schema, frozen=True):
    """The whole configuration."""

    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)
    batcher: BatcherConfig = msgspec.field(default_factory=BatcherConfig)
    workers: WorkersConfig = msgspec.field(default_factory=WorkersConfig)
    dicom: DicomConfig = msgspec.field(default_factory=DicomConfig)
    thermal: ThermalSection = msgspec.field(default_factory=ThermalSection)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    tls: TlsConfig = msgspec.field(default_factory=TlsConfig)
    access: AccessConfig = msgspec.field(default_factory=AccessConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)

    def models_dir(self) -> Path:
        """The model repository directory."""
        return Path(self.model.models_dir) if self.model.models_dir else default_home() / "models"

    def pipelines_dir(self) -> Path:
        """The pipelines directory."""
        return Path(self.model.pipelines_dir) if self.model.pipelines_dir else default_home() / "pipelines"


def _ranges() -> dict[str, tuple[float, float]]:
    ranges: dict[str, tuple[float, float]] = {}
    for key, bounds in numeric_ranges(Config):
        if bounds is None:
            raise TypeError(f"config key {key} is numeric but has no Meta(ge=..., le=...) range")
        ranges[key] = bounds
    return ranges


#: Every numeric key: (min, max) inclusive, read from the schema's ``Meta`` annotations (the one source).
#: docs/operations.md documents the same table; a test keeps the two equal. ``[thermal.governor]`` is
#: ThermalConfig, which checks its own values; ``[engine.options]`` are typed by each backend.
RANGES: dict[str, tuple[float, float]] = _ranges()


def _engine_options(raw: Any, backend: str) -> EngineOptionsSchema:
    """Convert ``[engine.options]`` with the schema of ``backend`` (for "auto": of every backend it may pick)."""
    from appliance.engines import AUTO_ORDER, BACKENDS, options_schema

    if backend != "auto" and backend not in BACKENDS:
        raise ConfigError(f"config key engine.backend: unknown backend {backend!r}; known: auto, {', '.join(BACKENDS)}")
    schema = options_schema(AUTO_ORDER if backend == "auto" else (backend,))
    if isinstance(raw, dict):
        known = {f.encode_name for f in msgspec.structs.fields(schema)}
        for key in raw:
            if key not in known:
                raise ConfigError(f"config key engine.options.{key}: unknown option for backend {backend!r} "
                                  f"(known: {', '.join(sorted(known)) or 'none'})")
    return convert(raw, schema, where="config key", error=ConfigError, at=("engine", "options"))


def _validate(cfg: Config) -> None:
    from appliance.serving.listen import validate_listeners

    paths = (("model.models_dir", cfg.model.models_dir), ("model.pipelines_dir", cfg.model.pipelines_dir),
             ("engine.cache_dir", cfg.engine.cache_dir), ("logging.uid_key_file", cfg.logging.uid_key_file),
             ("tls.cert_file", cfg.tls.cert_file), ("tls.key_file", cfg.tls.key_file),
             ("tls.client_ca_file", cfg.tls.client_ca_file), ("thermal.state_file", cfg.thermal.state_file))
    for key, value in paths:
        if value and not Path(value).is_absolute():  # relative to what the service ran in (/ under systemd)
            raise ConfigError(f"config key {key}: must be an absolute path, got {value!r} (a relative path would "
                              "resolve against the service's working directory, / under systemd)")
    validate_listeners(cfg)
    if cfg.server.inflight_bytes < cfg.server.max_message_bytes:
        raise ConfigError(f"config key server.inflight_bytes: must be >= server.max_message_bytes "
                          f"({cfg.server.max_message_bytes}), got {cfg.server.inflight_bytes}")


def _merge(raw: dict[str, Any], overrides: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    for section, values in (overrides or {}).items():
        table = raw.get(section, {})
        if isinstance(table, dict) and isinstance(values, Mapping):
            raw[section] = {**table, **values}
        else:  # not a table on one side: the schema says what is wrong with the result
            raw[section] = values
    return raw


def load_config(path: Path | str | None = None, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """Load a TOML config (or the defaults when ``path`` is None), apply ``overrides`` and validate.

    Raises:
        ConfigError: the file is unreadable or invalid; the message names the full key path, e.g.
            ``config key server.inflight_bytes: expected int >= 1024, got 12 (range 1024 .. 1099511627776)``.
    """
    raw = _merge(read_toml(path, "config file", ConfigError) if path is not None else {}, overrides)
    engine = raw.get("engine")
    options: Any = {}
    if isinstance(engine, dict) and "options" in engine:
        engine = dict(engine)
        options = engine.pop("options")
        raw = {**raw, "engine": engine}
    cfg = convert(raw, Config, where="config key", error=ConfigError)
    typed = _engine_options(options, cfg.engine.backend)
    cfg = msgspec.structs.replace(cfg, engine=msgspec.structs.replace(cfg.engine, options=typed))
    _validate(cfg)
    return cfg

