"""Progress of every stage, for health and the systemd watchdog.

A stage is live when it has no work, or made progress recently. "Work pending but nothing finished for N s"
is a stall: health goes NOT_SERVING with the stage named, and ``WATCHDOG=1`` is withheld so systemd restarts a
daemon that stays wedged (docs/robustness.md). Each stage reports itself through a small callable, so the
monitor knows nothing about workers, engines or thermometers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Stage", "StageProgress", "stalled"]


@dataclass(frozen=True)
class StageProgress:
    """One stage's state at one instant."""

    pending: int  # work waiting on this stage (0 = idle, always live)
    last_progress: float  # monotonic time of its last step forward (or idle tick)


@dataclass(frozen=True)
class Stage:
    """A named stage, how to read it, and how long it may go without progress while it has work."""

    name: str
    read: Callable[[], StageProgress]
    limit_s: float


def stalled(stages: list[Stage], now: float) -> list[str]:
    """Return ``"name (N s)"`` for every stage with pending work and no progress within its limit."""
    out = []
    for stage in stages:
        progress = stage.read()
        age = now - progress.last_progress
        if progress.pending > 0 and age > stage.limit_s:
            out.append(f"{stage.name} ({age:.0f} s without progress, {progress.pending} pending)")
    return out
