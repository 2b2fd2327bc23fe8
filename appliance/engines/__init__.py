"""Engine registry: backends by name, imported lazily so heavy dependencies stay inside their backend.

``resolve(name)`` returns the class; ``"auto"`` walks :data:`AUTO_ORDER` and collects, for every backend
skipped, the reason (missing package, no GPU), which ``appliance backends`` and the startup log show.
"""

from __future__ import annotations

import importlib

from appliance.engines.base import Engine, EngineOptions
from appliance.errors import BackendUnavailable

__all__ = ["AUTO_ORDER", "BACKENDS", "Engine", "EngineOptions", "backend_report", "declared_options", "resolve"]

#: name -> "module:Class". Register here (import time only), never at run time.
BACKENDS: dict[str, str] = {
    "onnxruntime-cuda": "appliance.engines.onnxruntime:OrtCudaEngine",
    "onnxruntime-cpu": "appliance.engines.onnxruntime:OrtCpuEngine",
    "fake": "appliance.engines.fake:FakeEngine",
}

#: What "auto" tries, best first. The fake engine is never chosen automatically.
AUTO_ORDER: tuple[str, ...] = ("onnxruntime-cuda", "onnxruntime-cpu")


def _load_class(name: str) -> type[Engine]:
    try:
        target = BACKENDS[name]
    except KeyError:
        raise BackendUnavailable(f"unknown engine backend {name!r}; known: {sorted(BACKENDS)}") from None
    module_name, _, cls_name = target.partition(":")
    module = importlib.import_module(module_name)
    cls: type[Engine] = getattr(module, cls_name)
    return cls


def declared_options(name: str) -> dict[str, str]:
    """The ``[engine.options]`` keys backend ``name`` accepts (its class's ``OPTIONS``)."""
    try:
        return dict(_load_class(name).OPTIONS)
    except ImportError:  # the backend's module cannot even be imported here: it declares nothing usable
        return {}


def backend_report() -> dict[str, str | None]:
    """Return backend name -> None if usable here, else the reason it is not."""
    report: dict[str, str | None] = {}
    for name in BACKENDS:
        try:
            report[name] = _load_class(name).why_unavailable()
        except ImportError as e:  # a backend module whose own imports fail
            report[name] = f"import failed: {e}"
    return report


def resolve(name: str) -> tuple[type[Engine], dict[str, str]]:
    """Return the engine class for ``name`` (or the best available for "auto") and the skip reasons."""
    skipped: dict[str, str] = {}
    candidates = AUTO_ORDER if name == "auto" else (name,)
    for candidate in candidates:
        cls = _load_class(candidate)
        reason = cls.why_unavailable()
        if reason is None:
            return cls, skipped
        skipped[candidate] = reason
    detail = "; ".join(f"{k}: {v}" for k, v in skipped.items())
    raise BackendUnavailable(f"no usable engine backend for {name!r} ({detail})")
