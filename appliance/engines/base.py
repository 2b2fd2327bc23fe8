"""The engine seam: one fixed-batch model, run by exactly one thread.

Contract:
- ``load()`` prepares everything (session, engine plan, buffers) and ``warmup()`` runs at least one batch, so
  the first real request is not slow. Both run on the engine thread.
- ``run(batch)`` takes exactly ``[B, *item_shape]`` float32 (a shape/dtype guard rejects anything else) and
  returns a dict of outputs keyed by name, each with first dimension B. Padding rows are the caller's:
  the engine never sees a partial batch.
- A failure of one batch raises :class:`~appliance.errors.EngineError`; a failure after which no batch can
  run (device lost, context corrupt) raises :class:`~appliance.errors.EngineDeadError`.
- ``backend`` names what *actually* runs (e.g. ``onnxruntime:CPUExecutionProvider``), never what was asked.
- Pipelining (optional for callers): ``submit(batch)`` returns a ticket and ``result(ticket)`` the outputs,
  oldest first, with at most ``max_in_flight`` tickets outstanding. The default runs the batch inside
  ``submit`` (``max_in_flight`` 1); the TensorRT engine returns at once and copies the next batch while the
  previous one computes (``max_in_flight`` 2). ``run(batch)`` is always ``result(submit(batch))``-equivalent.
"""

from __future__ import annotations

import abc
import os
from typing import Annotated, Any, ClassVar

import msgspec
import numpy as np

from appliance.errors import EngineError
from appliance.manifest import Artifact, Manifest

__all__ = [
    "DeviceId", "Engine", "EngineOptions", "EngineOptionsSchema", "OptimizationLevel", "Precision", "WorkspaceBytes",
    "usable_cores",
]

EngineOptions = dict[str, Any]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class EngineOptionsSchema(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The ``[engine.options]`` a backend reads from the config file: none (subclass it to declare some).

    A backend declares its options as a subclass with typed, defaulted fields (ranges as
    ``Annotated[..., msgspec.Meta(...)]``) and names it in ``Engine.OPTIONS``; the config loader converts the
    table with it, so an unknown key, a wrong type or an out-of-range value is refused naming the key.
    """

    def as_dict(self) -> dict[str, Any]:
        """The options as the plain dict an engine constructor takes (unset optional ones left out)."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}


#: TensorRT builder options shared by the ``tensorrt`` and ``onnxruntime-tensorrt`` backends.
Precision = str  # an artifact precision of the manifest, e.g. "w4a16" or "fp16"
WorkspaceBytes = Annotated[int, msgspec.Meta(ge=1 << 20, le=1 << 40)]
OptimizationLevel = Annotated[int, msgspec.Meta(ge=0, le=5)]
DeviceId = Annotated[int, msgspec.Meta(ge=0, le=63)]


class Engine(abc.ABC):
    """A fixed-batch model runner. Subclasses register in :mod:`appliance.engines`."""

    #: Registry name, e.g. "onnxruntime-cpu".
    name: ClassVar[str] = ""
    #: Python distributions this backend needs, name -> why (shown by `appliance backends`).
    DEPENDENCIES: ClassVar[dict[str, str]] = {}
    #: Batches that may be submitted before the oldest result is collected (see the module docstring).
    max_in_flight: ClassVar[int] = 1
    #: The typed ``[engine.options]`` this backend reads from the config file. Any other key in the file is a
    #: config error (appliance.config). Test-only objects (clocks, events) are not declared.
    OPTIONS: ClassVar[type[EngineOptionsSchema]] = EngineOptionsSchema
    #: The default :meth:`submit`'s finished batches, ticket -> outputs (created on first use).
    _pending_results: dict[object, dict[str, np.ndarray]]

    def __init__(self, manifest: Manifest, artifact: Artifact, options: EngineOptions | None = None) -> None:
        self.manifest = manifest
        self.artifact = artifact
        self.options: EngineOptions = dict(options or {})
        self.batch_size = manifest.input.batch_size
        self.item_shape = manifest.input.item_shape
        self.input_name = manifest.input.name
        self.output_names = tuple(o.name for o in manifest.outputs)

    @classmethod
    def why_unavailable(cls) -> str | None:
        """Return None if this backend can run here, else a human reason naming what is missing."""
        return None

    @property
    def precision(self) -> str:
        """The artifact's precision, e.g. "int4"."""
        return self.artifact.precision

    def host_cores(self) -> int:
        """The host cores the next batch computes on (0 for a device: a GPU's batch leaves them to the decoders)."""
        return 0

    @property
    @abc.abstractmethod
    def backend(self) -> str:
        """What actually runs, e.g. ``onnxruntime:CPUExecutionProvider``."""

    @abc.abstractmethod
    def load(self) -> None:
        """Load the artifact and allocate; raise EngineError/BackendUnavailable on failure."""

    @abc.abstractmethod
    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """Run one full batch; subclasses implement, :meth:`run` guards."""

    def run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """Run one full ``[B, ...]`` float32 batch and return outputs by name (first dim B)."""
        expected = (self.batch_size, *self.item_shape)
        if batch.shape != expected or batch.dtype != np.float32:
            raise EngineError(f"engine input must be float32 {list(expected)}, got {batch.dtype} {list(batch.shape)}")
        outputs = self._run(batch)
        for key, value in outputs.items():
            if value.shape[:1] != (self.batch_size,):
                raise EngineError(f"engine output {key!r} has shape {list(value.shape)}, expected first dim B")
        return outputs

    def submit(self, batch: np.ndarray) -> Any:
        """Start one batch; return a ticket for :meth:`result` (default: runs it now)."""
        pending: dict[object, dict[str, np.ndarray]] | None = getattr(self, "_pending_results", None)
        if pending is None:
            pending = self._pending_results = {}
        if len(pending) >= self.max_in_flight:
            raise EngineError(f"{self.max_in_flight} batch(es) already in flight: collect a result first")
        ticket = object()
        pending[ticket] = self.run(batch)
        return ticket

    def result(self, ticket: Any) -> dict[str, np.ndarray]:
        """Return the outputs of a submitted batch."""
        try:
            return self._pending_results.pop(ticket)
        except (AttributeError, KeyError):
            raise EngineError("result() for a ticket that was not submitted (or already collected)") from None

    def set_burst(self, on: bool) -> None:  # noqa: B027 - optional hook
        """Run the next batches with the burst thread pool (True) or the normal one (default: ignored).

        The batcher calls it before each batch with :func:`appliance.batching.policy.may_burst` (the
        preprocessing expected during the batch leaves a core idle for most of it, or a further full batch waits
        while no worker is busy); only a CPU backend with ``burst_threads`` above its intra-op threads acts on it.
        """

    def warmup(self, runs: int = 2) -> None:
        """Run ``runs`` zero batches so lazy initialisation happens before READY."""
        zeros = np.zeros((self.batch_size, *self.item_shape), dtype=np.float32)
        for _ in range(runs):
            self.run(zeros)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (default: nothing)."""
