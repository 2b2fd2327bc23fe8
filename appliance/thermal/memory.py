"""What the governor learned, kept across a restart of the daemon (docs/thermal.md, "Restarts").

A new governor starts from nothing: its budget from the first second's power, its die and heatsink models at rest
at that power. After a restart on a warm GPU under an on/off load that cost a quarter of the throughput for minutes
(served / ideal 0.73 restarting every 97 s, 0.84 every 300 s, 0.92 without restarts: scan in the docs) and sent some
healthy sensors BLIND. :class:`ThermalMemory` keeps a small file with the learned budget, the watts per duty and
the two models' powers; the next daemon on the same boot, the same settings and within :data:`MAX_AGE_S` starts from
them, each model cooled toward idle for the time it was away (the GPU idles while no daemon runs).

The file is a hint, never a requirement: a missing, unreadable, corrupt, foreign or stale one is ignored with a
reason in the log, and a failed write costs only the next restart's memory. Nothing in it identifies a patient.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.thermal.params import ThermalConfig

__all__ = ["BOOT_ID", "KEEP_EVERY_S", "MAX_AGE_S", "Learned", "ThermalMemory", "default_path", "fingerprint"]

log = logging.getLogger(__name__)

#: How old a memory may be and still be used, s: past it the room, the fan or the card may have changed.
MAX_AGE_S = 3600.0
#: How often a running daemon writes its memory, s (a crash loses at most this much learning).
KEEP_EVERY_S = 10.0
#: The kernel's id of this boot: monotonic time is comparable across processes of one boot only.
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_VERSION = 1
_UNREAD = object()


@dataclass(frozen=True)
class Learned:
    """What one governor learned that the next may start from (all in W)."""

    # The PI integrator, the learned sustainable budget; None before the PI first ran.
    integral_w: float | None
    # The learned watts of a full duty above idle.
    w_per_duty: float
    # The die model (low-passed power) when kept.
    die_w: float
    # The heatsink model (low-passed power) when kept.
    sink_w: float

    def checked(self, config: ThermalConfig) -> str:
        """Why these values cannot be this card's ("" when they can)."""
        top = 2.0 * config.p_max_w
        for name, value in dataclasses.asdict(self).items():
            if value is None and name == "integral_w":
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                return f"{name} is not a number"
            if not 0.0 <= value <= top:
                return f"{name} {value:g} W lies outside 0-{top:g} W"
        return ""


def fingerprint(config: ThermalConfig, identity: str = "") -> str:
    """A digest of the governor's settings and the GPU's identity.

    What was learned under other settings (recommissioned) or on another GPU (two daemons sharing a state
    directory) is not used.
    """
    text = json.dumps([dataclasses.asdict(config), identity], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_path(configured: str, index: int = 0, environ: Mapping[str, str] | None = None) -> Path | None:
    """Where the memory of GPU ``index`` lives.

    ``thermal.state_file``, else ``thermal-memory-gpu<index>.json`` in ``$STATE_DIRECTORY`` under systemd, else
    nowhere.
    """
    if configured:
        return Path(configured)
    env = os.environ if environ is None else environ
    state = env.get("STATE_DIRECTORY", "")
    return Path(state.split(":")[0]) / f"thermal-memory-gpu{index}.json" if state else None


class ThermalMemory:
    """Reads and writes one governor's :class:`Learned` at ``path`` (None: remembers nothing).

    Args:
        path: The file; its directory must exist (systemd's ``StateDirectory=``).
        config: The governor's settings (their :func:`fingerprint` with ``identity`` is kept and compared).
        identity: The GPU's (:attr:`~appliance.thermal.source.Thermometer.identity`: NVML's UUID).
        boot_id: Where the kernel's boot id is read (a test points it elsewhere).
    """

    def __init__(self, path: Path | None, config: ThermalConfig, identity: str = "", *,
                 boot_id: Path = BOOT_ID) -> None:
        self.path = path
        self._print = fingerprint(config, identity)
        self._config = config
        self._boot = _read_boot_id(boot_id)
        if path is not None and not self._boot:
            log.warning("thermal memory off: no boot id at %s (monotonic times cannot be compared across restarts)",
                        boot_id)
        self._raw: object = _UNREAD  # the file's bytes once load() ran (None: no file)
        self._kept_at: float | None = None
        self._failed = False  # a failed write is logged once, until one succeeds again
        self._wake = threading.Condition()
        self._pending: tuple[float, Learned] | None = None  # the newest learning not yet written
        self._writing = False
        self._writer: threading.Thread | None = None

    def load(self) -> None:
        """Read the file now (at start, off the thermal sample's lock: a disk that hangs must not hold it)."""
        if self.path is None:
            return
        try:
            self._raw = self.path.read_bytes()
        except FileNotFoundError:
            self._raw = None
        except OSError as e:
            log.warning("thermal memory %s unreadable (%s): the governor starts afresh", self.path, e.strerror or e)
            self._raw = None

    def recall(self, now_s: float) -> tuple[Learned, float] | None:
        """What :meth:`load` read, as :class:`Learned` and how long ago it was kept, s.

        None (and why, in the log) when unusable. Reads the file first if :meth:`load` has not.
        """
        if self.path is None:
            return None
        if self._raw is _UNREAD:
            self.load()
        raw, self._raw = self._raw, None
        if not isinstance(raw, bytes):
            return None
        try:
            found, why = self._parse(raw, now_s)
        except Exception as e:  # noqa: BLE001 - a file we cannot read is a fresh start, never a dead thermal loop
            found, why = None, f"unreadable ({type(e).__name__})"
        if found is None:
            log.info("thermal memory %s not used: %s; the governor starts afresh", self.path, why)
        return found

    def _parse(self, raw: bytes, now_s: float) -> tuple[tuple[Learned, float] | None, str]:
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return None, f"not JSON ({e})"
        if not isinstance(doc, dict) or doc.get("version") != _VERSION:
            return None, f"not a version {_VERSION} memory"
        if doc.get("boot_id") != self._boot or not self._boot:
            return None, "kept before the last boot"
        if doc.get("settings") != self._print:
            return None, "kept under other thermal.governor settings or for another GPU"
        kept = doc.get("monotonic_s")
        if not isinstance(kept, (int, float)) or not math.isfinite(kept):
            return None, "no time kept"
        age = now_s - float(kept)
        if not 0.0 <= age <= MAX_AGE_S:
            return None, f"kept {age:.0f} s ago (used up to {MAX_AGE_S:.0f} s)"
        values = doc.get("learned")
        try:
            learned = Learned(**values) if isinstance(values, dict) else None
        except TypeError:
            learned = None
        if learned is None:
            return None, "no learned values"
        why = learned.checked(self._config)
        return ((learned, age), "") if not why else (None, why)

    def due(self, now_s: float) -> bool:
        """Whether :data:`KEEP_EVERY_S` has passed since the last write (or none was made yet)."""
        return self.path is not None and bool(self._boot) and (
            self._kept_at is None or now_s - self._kept_at >= KEEP_EVERY_S)

    def keep(self, now_s: float, learned: Learned) -> None:
        """Hand ``learned`` to the writer thread (the newest waiting one wins) and return at once.

        The controller calls this from the thermal sample: a slow or hung disk (a failing card, a network mount) must
        not stall the sample, which the daemon would count as a failed read and hold, then go BLIND on.
        """
        if self.path is None or not self._boot:
            return
        self._kept_at = now_s
        with self._wake:
            self._pending = (now_s, learned)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="thermal-memory", daemon=True)
                self._writer.start()
            self._wake.notify_all()

    def flush(self, timeout_s: float = 2.0) -> bool:
        """Wait until what was handed over is on disk (at stop); False when the disk did not answer in time."""
        deadline = time.monotonic() + timeout_s
        with self._wake:
            while self._pending is not None or self._writing:
                left = deadline - time.monotonic()
                if left <= 0.0:
                    return False
                self._wake.wait(left)
        return True

    def _write_loop(self) -> None:
        while True:
            with self._wake:
                while self._pending is None:
                    self._wake.wait()
                (now_s, learned), self._pending = self._pending, None
                self._writing = True
            try:
                self._write(now_s, learned)
            except BaseException:  # noqa: BLE001 - the writer must outlive anything a write raises; said once
                log.exception("thermal memory writer failed")
            finally:
                with self._wake:
                    self._writing = False
                    self._wake.notify_all()

    def _write(self, now_s: float, learned: Learned) -> None:
        """Write atomically (a new file renamed over the old), owner-only; a failure is logged once."""
        assert self.path is not None
        doc: dict[str, Any] = {"version": _VERSION, "boot_id": self._boot, "settings": self._print,
                               "monotonic_s": now_s, "learned": dataclasses.asdict(learned)}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if not self._failed:
                log.warning("thermal memory %s not written (%s): a restart will start the governor afresh",
                            self.path, e.strerror or e)
            self._failed = True
            return
        if self._failed:
            log.info("thermal memory %s written again", self.path)
        self._failed = False


def _read_boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:  # not Linux, or /proc hidden: monotonic times cannot be compared across processes
        return ""
