"""Engine registry: backends by name, imported lazily so heavy dependencies stay inside their backend.

``resolve(name)`` returns the class to construct and the reasons collected so far. For ``"auto"`` it returns
:class:`AutoEngine`, which tries :data:`AUTO_ORDER` *when it loads* (on the engine thread): a backend whose
``why_unavailable()`` names a reason is skipped, and so is a GPU backend whose ``load()`` fails; the next one
is tried, and every skip is logged and kept in :attr:`AutoEngine.skipped` with its reason. So a GPU-less box
with the ``[gpu]`` extra serves on the CPU and says why. ``backend_report()`` is what
``appliance backends`` shows: for each backend, None (usable) or the reason it is not.
"""

from __future__ import annotations

import functools
import importlib
import logging
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import numpy as np

from appliance.engines.base import Engine, EngineOptions, EngineOptionsSchema
from appliance.errors import BackendUnavailable, EngineError

__all__ = ["AUTO_ORDER", "BACKENDS", "AutoEngine", "Engine", "EngineOptions", "EngineOptionsSchema", "backend_report",
           "declared_options", "options_schema", "resolve"]

log = logging.getLogger(__name__)

#: name -> "module:Class". Register here (import time only), never at run time.
BACKENDS: dict[str, str] = {
    "tensorrt": "appliance.engines.tensorrt:TensorrtEngine",
    "onnxruntime-tensorrt": "appliance.engines.onnxruntime:OrtTensorrtEngine",
    "onnxruntime-cuda": "appliance.engines.onnxruntime:OrtCudaEngine",
    "onnxruntime-cpu": "appliance.engines.onnxruntime:OrtCpuEngine",
    "fake": "appliance.engines.fake:FakeEngine",
    # remote: batches run on a Triton server (engine.options.url); never chosen by "auto"
    "triton": "appliance.engines.triton:TritonEngine",
}

#: What "auto" tries, best first. The fake engine is never chosen automatically.
AUTO_ORDER: tuple[str, ...] = ("tensorrt", "onnxruntime-tensorrt", "onnxruntime-cuda", "onnxruntime-cpu")


def _load_class(name: str) -> type[Engine]:
    try:
        target = BACKENDS[name]
    except KeyError:
        raise BackendUnavailable(f"unknown engine backend {name!r}; known: {sorted(BACKENDS)} or 'auto'") from None
    module_name, _, cls_name = target.partition(":")
    module = importlib.import_module(module_name)
    cls: type[Engine] = getattr(module, cls_name)
    return cls


def _why(name: str) -> str | None:
    try:
        return _load_class(name).why_unavailable()
    except ImportError as e:  # a backend module whose own imports fail
        return f"import failed: {e}"


def declared_options(name: str) -> type[EngineOptionsSchema]:
    """The typed ``[engine.options]`` backend ``name`` accepts (its class's ``OPTIONS``)."""
    try:
        return _load_class(name).OPTIONS
    except ImportError:  # the backend's module cannot even be imported here: it declares nothing usable
        return EngineOptionsSchema


def options_schema(names: Iterable[str]) -> type[EngineOptionsSchema]:
    """The options schema of one backend, or one merging the options of several (``auto`` may pick any).

    A key declared by more than one backend keeps the first one's type and default.
    """
    return _options_schema(tuple(names))


@functools.cache
def _options_schema(names: tuple[str, ...]) -> type[EngineOptionsSchema]:
    schemas = [declared_options(name) for name in names]
    if len(schemas) == 1:
        return schemas[0]
    fields: dict[str, tuple[str, Any, Any]] = {}
    for schema in schemas:
        hints = typing.get_type_hints(schema, include_extras=True)
        for f in msgspec.structs.fields(schema):
            default = f.default
            if default is msgspec.NODEFAULT:
                default = msgspec.field(default_factory=f.default_factory)
            fields.setdefault(f.name, (f.name, hints[f.name], default))
    name = "EngineOptions_" + "_".join(n.replace("-", "_") for n in names)
    merged = msgspec.defstruct(name, list(fields.values()), bases=(EngineOptionsSchema,), frozen=True,
                               forbid_unknown_fields=True, kw_only=True, module=__name__)
    globals()[name] = merged  # picklable by name, like the declared ones
    return typing.cast(type[EngineOptionsSchema], merged)


def nvidia_device_present() -> bool:
    """Whether this machine shows an NVIDIA GPU device node (``/dev/nvidia0``...), whatever its driver's state."""
    return any(p.name[len("nvidia"):].isdigit() for p in Path("/dev").glob("nvidia*"))


def backend_report() -> dict[str, str | None]:
    """Return backend name -> None if usable here, else the reason it is not (found by trying)."""
    return {name: _why(name) for name in BACKENDS}


def resolve(name: str) -> tuple[type[Engine], dict[str, str]]:
    """Return the engine class for ``name`` and the reasons of backends skipped so far.

    ``"auto"`` gives :class:`AutoEngine` (which chooses when it loads); a named backend that cannot run here
    raises :class:`BackendUnavailable` with its reason. Both ``onnxruntime`` distributions installed together
    is refused for every backend.
    """
    from appliance.engines.onnxruntime import check_distributions

    both = check_distributions()
    if both:
        raise BackendUnavailable(both)
    if name == "auto":
        return AutoEngine, {}
    cls = _load_class(name)
    reason = cls.why_unavailable()
    if reason is not None:
        raise BackendUnavailable(f"engine backend {name!r} cannot run here: {reason}")
    return cls, {}


class AutoEngine(Engine):
    """Chooses the backend at :meth:`load` time: the first of ``order`` that is available *and* loads.

    Options are passed to the chosen backend; ``auto_order`` overrides :data:`AUTO_ORDER` (tests), and
    ``auto_classes`` maps names to classes (tests use fakes). After load, :attr:`chosen` is the engine that
    runs and :attr:`skipped` maps each skipped backend to its reason.
    """

    name = "auto"
    DEPENDENCIES: ClassVar[dict[str, str]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order: tuple[str, ...] = tuple(self.options.pop("auto_order", AUTO_ORDER))
        self.classes: dict[str, type[Engine]] = dict(self.options.pop("auto_classes", {}))
        self.chosen: Engine | None = None
        self.skipped: dict[str, str] = {}
        self.fallback: str | None = None  # set when the CPU was chosen on a machine that shows a GPU

    @property
    def backend(self) -> str:
        """What the chosen backend runs, or ``auto (not loaded)``."""
        return self.chosen.backend if self.chosen is not None else "auto (not loaded)"

    def host_cores(self) -> int:
        """The host cores the chosen backend's next batch computes on."""
        return self.chosen.host_cores() if self.chosen is not None else 0

    @property
    def precision(self) -> str:
        """The chosen backend's artifact precision."""
        return self.chosen.precision if self.chosen is not None else self.artifact.precision

    def load(self) -> None:
        """Try each backend in order; keep the first that loads; raise with every reason if none does."""
        for name in self.order:
            try:
                cls = self.classes.get(name) or _load_class(name)
                reason = cls.why_unavailable()
            except ImportError as e:
                reason = f"import failed: {e}"
            if reason is None:
                engine = cls(self.manifest, self.artifact, self.options)
                try:
                    engine.load()
                except (BackendUnavailable, EngineError) as e:  # e.g. a CUDA call failing: try the next
                    reason = f"failed to load: {e}"
                    engine.close()
                else:
                    self.chosen = engine
                    self.artifact = engine.artifact
                    log.info("engine backend auto -> %s (%s)", name, engine.backend)
                    self._note_fallback(name)
                    return
            self.skipped[name] = reason
            log.warning("engine backend %s skipped: %s", name, reason)
        raise BackendUnavailable(f"no usable engine backend for 'auto' ({self._skipped_detail()})")

    def _skipped_detail(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in self.skipped.items())

    def _note_fallback(self, name: str) -> None:
        """Say loudly when a machine with a GPU ends up on the CPU (a driver late at boot, a broken install).

        Until a restart it serves at CPU speed: the status shows DEGRADED with this reason (ops review, session 14:
        only one WARNING per skipped backend said so, and the box ran on the CPU for good).
        """
        if name != "onnxruntime-cpu" or not self.skipped or not nvidia_device_present():
            return
        self.fallback = f"engine on the CPU although this machine has an NVIDIA GPU ({self._skipped_detail()})"
        log.warning("%s: restart the service once the GPU backend can load (`appliance backends` says why)",
                    self.fallback)

    def warmup(self, runs: int = 2) -> None:
        """The chosen backend's warm-up (TensorRT captures its CUDA graphs there)."""
        self._require().warmup(runs)

    def _require(self) -> Engine:
        if self.chosen is None:
            from appliance.errors import EngineDeadError

            raise EngineDeadError("engine not loaded")
        return self.chosen

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        return self._require()._run(batch)

    @property
    def max_in_flight(self) -> int:  # type: ignore[override]
        """The chosen backend's pipelining depth."""
        return self.chosen.max_in_flight if self.chosen is not None else 1

    def submit(self, batch: np.ndarray) -> Any:
        """The chosen backend's :meth:`~appliance.engines.base.Engine.submit`."""
        return self._require().submit(batch)

    def set_burst(self, on: bool) -> None:
        """The chosen backend's :meth:`~appliance.engines.base.Engine.set_burst`."""
        self._require().set_burst(on)

    def result(self, ticket: Any) -> dict[str, np.ndarray]:
        """The chosen backend's :meth:`~appliance.engines.base.Engine.result`."""
        return self._require().result(ticket)

    def close(self) -> None:
        """Close the chosen backend."""
        if self.chosen is not None:
            self.chosen.close()
