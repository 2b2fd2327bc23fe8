"""What the request path answers, and the :class:`Analyzer` protocol every gRPC servicer speaks to.

:class:`~appliance.serving.analyze.RequestPath` is the daemon's Analyzer; :mod:`appliance.fakes.analyzer` stands in
for it in tests of the protocol layers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from appliance.batching.work import Priority
from appliance.errors import ApplianceError

__all__ = ["AdmitFrames", "Analysis", "Analyzer", "FrameAnalysis", "ModelInfo"]

#: A stream's (or a multi-file OIP request's) admission hook: awaited with a parsed file's frame count before its
#: slots are reserved; what it returns, if anything, is called once the file is admitted (or refused), which lets the
#: next file of the window go to a worker (``server.FrameShare``).
AdmitFrames = Callable[[int], Awaitable[Callable[[], None] | None]]


@dataclass(frozen=True)
class ModelInfo:
    """The served model, as clients see it."""

    name: str
    version: str
    precision: str
    backend: str  # what actually runs, e.g. "onnxruntime:CPUExecutionProvider"
    batch_size: int  # fixed B
    input_name: str
    item_shape: tuple[int, ...]  # one item, float32
    outputs: tuple[tuple[str, tuple[int, ...]], ...]  # (name, per-item shape), float32


@dataclass(frozen=True)
class FrameAnalysis:
    """One frame's result."""

    frame_index: int
    outputs: dict[str, np.ndarray]  # this frame's row of every engine output
    label: str  # top finding
    scores: dict[str, float]  # label -> probability
    location: tuple[float, float, float] | None  # (row, col, score) in original-frame pixels
    lossy: bool = False  # the pixels went through lossy compression (FrameInfo.lossy)


@dataclass(frozen=True)
class Analysis:
    """One instance's result and where its time went."""

    request_id: str
    sop_instance_uid: str  # never log it raw
    pipeline: str
    frames: tuple[FrameAnalysis, ...]
    queue_ms: float  # longest wait of a ready frame for its batch
    preprocess_ms: float  # decode + preprocess, all frames
    engine_ms: float  # the slowest batch that carried a frame
    total_ms: float


class Analyzer(Protocol):
    """What a protocol front end needs from the appliance (a fake can stand in for it in tests)."""

    @property
    def model(self) -> ModelInfo:
        """The served model."""
        ...

    def is_live(self) -> bool:
        """False only when the daemon is terminally broken (engine dead, GPU lost)."""
        ...

    def is_ready(self) -> bool:
        """True while new work is admitted."""
        ...

    async def analyze(self, dicom: bytes, *, request_id: str = "", pipeline: str = "",
                      priority: Priority = Priority.BATCH, time_remaining: float | None = None,
                      admit_frames: AdmitFrames | None = None, wait_for_budget: bool = False,
                      source: str = "", counted: bool = True, entered: bool = False) -> Analysis:
        """Analyze one DICOM Part 10 file; ``source`` is the sender (gRPC peer), whose jobs take turns.

        ``admit_frames`` (a stream's, or the files of one OIP request) is awaited with the file's frame count before
        its slots are reserved, and ``wait_for_budget`` waits for the in-flight byte budget instead of refusing.
        ``counted=False``: the caller counts the request it belongs to (:meth:`count_finished`), not this file.
        ``entered=True``: a file of a call inside :meth:`entered`, which a drain begun since does not refuse.
        """
        ...

    def entered(self) -> AbstractContextManager[None]:
        """A call of several files through the door: refused here while draining, else waited for whole by a drain."""
        ...

    async def infer(self, inputs: np.ndarray, *, request_id: str = "", priority: Priority = Priority.BATCH,
                    time_remaining: float | None = None, source: str = "") -> list[dict[str, np.ndarray]]:
        """Run already preprocessed float32 inputs ``[N, *item_shape]``; one dict of outputs per row."""
        ...

    def count_refused(self, error: ApplianceError) -> None:
        """Count a request a protocol front end refused itself (before analyze or infer), for the metrics."""
        ...

    def count_finished(self, code: str, seconds: float | None) -> None:
        """Count a request whose files were analyzed uncounted (its final gRPC code name; its seconds if OK)."""
        ...
