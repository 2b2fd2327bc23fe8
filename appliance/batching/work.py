"""Work items: what crosses from the server to the batcher and back. No patient data in any repr."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from appliance.errors import ApplianceError

if TYPE_CHECKING:
    from appliance.pipeline.steps import FrameInfo

__all__ = ["ItemState", "Priority", "Request", "WorkItem"]


class Priority(enum.IntEnum):
    """Scheduling class; lower value goes first. Values match ``appliance.v1.Priority``."""

    INTERACTIVE = 0
    BATCH = 1


class ItemState(enum.IntEnum):
    """Life of one frame. Ordering rule: anything >= DONE is finished and never changes again."""

    ADMITTED = 0  # slot reserved, waiting for a preprocessing worker (or the engine thread, sequential mode)
    PREPROCESSING = 1  # a worker is writing the slot
    READY = 2  # the slot holds the model input; waiting for a batch
    RUNNING = 3  # gathered into a launched batch
    DONE = 4  # outputs attached
    FAILED = 5  # error attached
    CANCELLED = 6  # the client went away; never computed (or its late result dropped)
    EXPIRED = 7  # its deadline passed before launch; never computed

    @property
    def finished(self) -> bool:
        """True for DONE and every state after it."""
        return self >= ItemState.DONE


@dataclass(eq=False)
class WorkItem:
    """One frame of one request, bound to one slot of the batcher's input arena."""

    request: Request  # the request this frame belongs to
    frame_index: int  # frame number inside the instance
    slot: int = -1  # index into the batcher's slot arena; -1 once released
    state: ItemState = ItemState.ADMITTED
    t_ready: float | None = None  # monotonic time the slot became READY
    t_launch: float | None = None  # monotonic time its batch launched
    preprocess_ms: float = 0.0  # decode + preprocess time of this frame
    engine_ms: float = 0.0  # engine time of the batch that carried it
    frame_info: FrameInfo | None = None  # from the worker: geometry for mapping outputs back (None for tensors)
    outputs: dict[str, np.ndarray] | None = None  # this item's rows of each engine output
    error: ApplianceError | None = None

    @property
    def priority(self) -> Priority:
        """Its request's scheduling class."""
        return self.request.priority

    @property
    def deadline(self) -> float | None:
        """Its request's monotonic deadline, or None."""
        return self.request.deadline

    def __repr__(self) -> str:
        return (
            f"WorkItem(request={self.request.request_id!r}, frame={self.frame_index}, "
            f"slot={self.slot}, state={self.state.name})"
        )


@dataclass(eq=False)
class Request:
    """One request: one DICOM instance (or one tensor), one pipeline, one or more frames.

    The daemon never holds the parsed dataset: a worker process parses it and sends back only the frame count
    and the SOP Instance UID (:meth:`set_frames`). ``on_done`` is called exactly once, from whichever thread
    finishes the last frame; the request path uses it to resolve an asyncio future.
    """

    request_id: str  # client-supplied (validated) or server-assigned id
    pipeline: str  # pipeline name ("" for tensor requests)
    priority: Priority  # INTERACTIVE before BATCH
    deadline: float | None  # monotonic; None = no deadline
    t_admit: float  # monotonic time the request arrived
    n_frames: int = 0  # frames to compute; 0 until the worker has parsed the instance
    sop_instance_uid: str = ""  # from the worker; never logged raw
    on_done: Callable[[Request], None] | None = None  # completion callback (any thread)
    items: list[WorkItem] = field(default_factory=list)
    _remaining: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _done_called: bool = False

    def __post_init__(self) -> None:
        if self.n_frames:
            self.set_frames(self.n_frames)

    def set_frames(self, n_frames: int, sop_instance_uid: str = "") -> None:
        """Create the request's frames (once its instance is parsed)."""
        self.n_frames = n_frames
        if sop_instance_uid:
            self.sop_instance_uid = sop_instance_uid
        self.items = [WorkItem(request=self, frame_index=i) for i in range(n_frames)]
        self._remaining = n_frames

    def __repr__(self) -> str:
        return f"Request(id={self.request_id!r}, frames={self.n_frames}, priority={self.priority.name})"

    @property
    def finished(self) -> bool:
        """True once every frame is finished."""
        return self._remaining == 0

    @property
    def error(self) -> ApplianceError | None:
        """The first frame error, if any frame failed, was cancelled or expired."""
        for item in self.items:
            if item.error is not None:
                return item.error
        return None

    def item_finished(self) -> None:
        """Count one frame as finished; call ``on_done`` after the last. Thread-safe, idempotent per frame."""
        with self._lock:
            self._remaining -= 1
            fire = self._remaining == 0 and not self._done_called
            if fire:
                self._done_called = True
        if fire and self.on_done is not None:
            self.on_done(self)
