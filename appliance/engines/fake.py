"""A fake engine shipped in the package: deterministic outputs, scripted latency, failures and hangs.

Outputs follow the manifest: an output of shape ``[B, 1]`` or ``[B]`` gets each row's mean input value (a
"score" in [0, 1] for unit-range inputs); an output ``[B, h, w]`` gets the input average-pooled to h x w. So a
test can put a known image into a request and predict the reply exactly. Every batch it runs is recorded
(number of non-zero rows, time), which is how tests see padding.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any, ClassVar

import numpy as np
from msgspec import Meta

from appliance.clock import Clock, RealClock
from appliance.engines.base import Engine, EngineOptionsSchema
from appliance.errors import EngineDeadError, EngineError

__all__ = ["FakeEngine", "FakeOptions"]


class FakeOptions(EngineOptionsSchema, frozen=True):
    """``[engine.options]`` of the fake engine (``backend = "fake"``)."""

    latency_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 0.0  # seconds slept per batch
    fail_batches: tuple[Annotated[int, Meta(ge=0)], ...] = ()  # batch numbers that raise EngineError
    dead_after: Annotated[int, Meta(ge=0)] | None = None  # batch number from which EngineDeadError is raised
    hang_after: Annotated[int, Meta(ge=0)] | None = None  # batch number from which run() blocks forever


class FakeEngine(Engine):
    """Fixed-batch fake.

    Options: ``latency_s`` (per batch, slept on the given clock), ``clock``, ``fail_batches`` (set of batch numbers that
    raise EngineError), ``dead_after`` (batch number from which EngineDeadError is raised), ``hang`` (a threading.Event:
    run blocks until it is set), ``hang_after`` (batch number from which run blocks forever, like a hung device call),
    ``load_gate`` (a threading.Event that load() waits for, like a slow engine build).
    """

    name = "fake"
    DEPENDENCIES: ClassVar[dict[str, str]] = {}
    OPTIONS: ClassVar[type[EngineOptionsSchema]] = FakeOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clock: Clock = self.options.get("clock") or RealClock()
        self.latency_s = float(self.options.get("latency_s", 0.0))
        self.fail_batches: set[int] = set(self.options.get("fail_batches", ()))
        self.dead_after: int | None = self.options.get("dead_after")
        self.hang: threading.Event | None = self.options.get("hang")
        self.hang_after: int | None = self.options.get("hang_after")  # block forever from this batch on
        self.load_gate: threading.Event | None = self.options.get("load_gate")  # load() waits for it
        self.batches: list[np.ndarray] = []  # copies of every batch run (warm-up excluded)
        self.bursts: list[bool] = []  # the set_burst flag each of those batches ran with
        self._burst = False
        self.loaded = False
        self._warming = False

    @property
    def backend(self) -> str:
        """Always ``fake``."""
        return "fake"

    def load(self) -> None:
        """Nothing to load (waits for ``load_gate`` if given, like a slow engine build)."""
        if self.load_gate is not None:
            self.load_gate.wait()
        self.loaded = True

    def warmup(self, runs: int = 2) -> None:
        """Run zero batches without recording them."""
        self._warming = True
        try:
            super().warmup(runs)
        finally:
            self._warming = False

    def set_burst(self, on: bool) -> None:
        """Record the flag for the next batches (``bursts``), as the CPU backend would switch thread pools."""
        self._burst = on

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        if not self._warming:
            n = len(self.batches)
            self.batches.append(batch.copy())
            self.bursts.append(self._burst)
            if self.dead_after is not None and n >= self.dead_after:
                raise EngineDeadError(f"fake engine dead at batch {n}")
            if n in self.fail_batches:
                raise EngineError(f"fake engine failed batch {n}")
            if self.hang is not None:
                self.hang.wait()
            if self.hang_after is not None and n >= self.hang_after:
                threading.Event().wait()  # a hung device call: only the watchdog notices
        if self.latency_s:
            self.clock.sleep(self.latency_s)
        flat = batch.reshape(batch.shape[0], -1)
        outputs: dict[str, np.ndarray] = {}
        for spec in self.manifest.outputs:
            if len(spec.shape) <= 2:
                outputs[spec.name] = flat.mean(axis=1).reshape(spec.shape).astype(np.float32)
            else:
                h, w = spec.shape[-2:]
                img = batch.reshape(batch.shape[0], -1, *batch.shape[-2:]).mean(axis=1)
                fy, fx = img.shape[1] // h, img.shape[2] // w
                pooled = img[:, : h * fy, : w * fx].reshape(batch.shape[0], h, fy, w, fx).mean(axis=(2, 4))
                outputs[spec.name] = pooled.reshape(spec.shape).astype(np.float32)
        return outputs

    def real_rows(self) -> list[int]:
        """Return, per recorded batch, how many rows were not all-zero padding."""
        return [int(np.count_nonzero(b.reshape(b.shape[0], -1).any(axis=1))) for b in self.batches]
