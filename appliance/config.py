"""Configuration: frozen dataclasses loaded from TOML once at startup. Errors name the key.

Every section and key is optional; defaults are the embedded default (CPU engine, bundled model, no thermal
sensor when there is no GPU). Unknown keys are errors, so a typo never silently falls back to a default.
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

from appliance.batcher import BatcherConfig
from appliance.errors import ConfigError

__all__ = [
    "Config",
    "DicomConfig",
    "EngineConfig",
    "MetricsConfig",
    "ModelConfig",
    "ServerConfig",
    "ThermalSection",
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
class ServerConfig:
    """``[server]``: where and how the gRPC daemon listens."""

    listen: tuple[str, ...] = ("127.0.0.1:50051", "unix:/tmp/edge-appliance/grpc.sock")  # addresses to bind
    max_message_bytes: int = 64 << 20  # largest accepted request (DoS bound); larger -> RESOURCE_EXHAUSTED
    reflection: bool = True  # gRPC server reflection
    grace_s: float = 10.0  # on SIGTERM: finish in-flight work within this, then exit 0
    default_deadline_s: float = 0.0  # deadline applied when the client sends none (0 = none)


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
    options: dict[str, Any] = field(default_factory=dict)  # backend-specific options (e.g. the fake engine's)


@dataclass(frozen=True)
class DicomConfig:
    """``[dicom]``: input limits, checked before allocating."""

    max_pixels_per_frame: int = 4096 * 4096
    max_frames: int = 512
    max_decoded_bytes: int = 1 << 30


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

    listen: str = ""  # e.g. "127.0.0.1:9108"; "" = off
    window: int = 2048  # samples kept for percentiles


@dataclass(frozen=True)
class Config:
    """The whole configuration."""

    server: ServerConfig = field(default_factory=ServerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    dicom: DicomConfig = field(default_factory=DicomConfig)
    thermal: ThermalSection = field(default_factory=ThermalSection)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

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


def _validate(cfg: Config) -> None:
    checks = [
        (cfg.server.max_message_bytes > 0, "server.max_message_bytes must be > 0"),
        (cfg.server.grace_s >= 0, "server.grace_s must be >= 0"),
        (cfg.server.default_deadline_s >= 0, "server.default_deadline_s must be >= 0"),
        (cfg.metrics.window >= 1, "metrics.window must be >= 1"),
        (cfg.engine.warmup_runs >= 0, "engine.warmup_runs must be >= 0"),
        (len(cfg.server.listen) > 0, "server.listen must name at least one address"),
        (cfg.batcher.max_wait_s >= 0, "batcher.max_wait_s must be >= 0"),
        (cfg.batcher.queue_capacity >= 1, "batcher.queue_capacity must be >= 1"),
        (cfg.batcher.preprocess_workers >= 1, "batcher.preprocess_workers must be >= 1"),
        (cfg.engine.intra_op_threads >= 1, "engine.intra_op_threads must be >= 1"),
        (cfg.thermal.sensor in ("auto", "nvml", "none", "sim"), "thermal.sensor must be auto, nvml, none or sim"),
        (cfg.thermal.period_s > 0, "thermal.period_s must be > 0"),
        (cfg.dicom.max_frames >= 1, "dicom.max_frames must be >= 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def load_config(path: Path | str | None = None, overrides: dict[str, dict[str, Any]] | None = None) -> Config:
    """Load a TOML config (or the defaults when ``path`` is None), apply ``overrides`` and validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} not found") from None
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
