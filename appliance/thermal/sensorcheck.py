"""The frozen-sensor detector: is an unchanging reading still alive? Pure: samples in, verdict out.

A reading that freezes at a plausible value is the one sensor fault that looks like good news, and no
passive test can catch every case: under steady power in a slowly warming room, a frozen reading and a
live one at equilibrium give the governor exactly the same samples. So the detector asks the plant
(``docs/thermal.md``, "Frozen sensor"):

1. **Model path.** A first-order model of the die over its heatsink, driven by the measured power
   (``dT/dt = (R_jh·P − T)/τ_die``, R_jh and τ_die from commissioning, defaults on the cautious side), runs
   all the time; its change since the reading last changed is what the reading should have shown. Only the
   fast die node is modelled: the slow heatsink adds to the real change in the same direction, so leaving it
   out errs towards fewer false positives, and a model running through transients (not one anchored at the
   last change) does not mistake a settling die for a moving one. When that change is a rise of at least
   ``stuck_expect_c`` and the reading still has not moved ``sensor_delay_s`` later, the sensor is stuck. A load
   step under a frozen reading is caught in seconds. A fall is only judged during a probe (below), against
   the larger ``probe_expect_c``: outside one, a frozen reading while power falls errs on the safe side, and a
   warming heatsink or room can hold a live die still while the power eases off.
2. **Probe path.** When the reading has not changed for longer than its own recent history makes plausible
   (three times the longest of its last 8 unchanged runs, at least ``min_probe_after_s`` or, when the
   reading was climbing, ``climb_probe_after_s``, at most
   ``probe_after_s``; a noisy or warming sensor changes every few seconds, a clean settled one may sit still
   for minutes; each live answer doubles the next wait) while the GPU is busy, the detector asks for a duty
   probe: a ramp down
   of ``probe_rate`` of the busy fraction per second. It ends at the first reading change (a live sensor; on
   average half a degree of dip), or when the model path (above) declares the sensor stuck.
   ``probe_after_s`` bounds the drift the governor can miss between probes: at the worst rated room drift
   (4 °C/h) 240 s is 0.27 °C.
3. **Hold.** While the reading is unchanged for longer than twice that recent run (between
   ``min_hold_s`` and ``frozen_hold_s``), the governor may not raise its budget: a live die answers a higher
   budget within seconds, so an unchanged reading gives no licence to raise it further. This bounds what a
   frozen reading below the setpoint can do before 1 or 2 fire.

4. **Unseen rise.** With the heatsink's commissioned rise and time constant, a second (slow) node joins the
   model; while the reading is unchanged, the governor regulates on the reading plus the model's rise since
   the last change beyond half a degree (:meth:`FrozenDetector.unseen_rise`). A reading that freezes while a
   busy die is still warming is then throttled on the model until 1 or 2 declare it stuck.

5. **Gaps are not changes.** A failed or rejected read (:meth:`FrozenDetector.skip`) keeps the reference:
   the reading has not been seen to move, so the unchanged run, the model's change since it began and a probe
   all go on across it (the model integrates the power through it). Forgetting them let a frozen sensor that
   also fails one read a minute be believed for ever (83.9 °C on the 5090 plant in a warming room).
6. **A jump is suspect until the reading moves on its own.** A value the governor only accepted because
   several reads in a row agreed on it after a jump it first rejected (``jumped``) may be a sensor that froze
   far from the die. Until the next ordinary change, the budget may not rise (:attr:`FrozenCheck.suspect`
   keeps the duty where it was, even below the switch-on temperature) and a probe starts after
   ``climb_probe_after_s``.

7. **A pause is a probe.** While dispatch is paused (EMERGENCY) or held at its minimum duty, a live die falls
   as the power does; a reading that shows none of the die node's expected fall (``probe_expect_c``) since it
   last changed is stuck. Without this a reading frozen above the emergency threshold paused dispatch for as
   long as it stayed frozen (the blind duty is safe and serves).

A false positive costs throughput (the commissioned blind duty until the reading moves and
``recover_samples`` good samples pass), never safety.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["FrozenCheck", "FrozenDetector", "FrozenSettings"]


@dataclass(frozen=True)
class FrozenSettings:
    """What the detector needs to know about the plant (commissioning measures the first three)."""

    # Die rise over the heatsink at nameplate power, °C (P_max · R_jh).
    die_rise_c: float
    # Nameplate dynamic power (P_max − P_idle), W: with die_rise_c gives R_jh.
    p_max_w: float
    # Die time constant R_jh · C_j, s.
    die_tau_s: float
    # Longest sensor delay to allow for, s.
    sensor_delay_s: float
    # Expected change that a live reading must show, °C (>= 1 crosses an integer step for sure).
    stuck_expect_c: float
    # Expected fall during a probe that a live reading must show, °C.
    probe_expect_c: float
    # Unchanged reading this long (while busy near the setpoint) starts a probe, s.
    probe_after_s: float
    # Probe ramp: fraction of the busy fraction removed per second.
    probe_rate: float
    # Largest probe cut, fraction of the busy fraction.
    probe_max_cut: float
    # No budget increase while the reading is unchanged for longer than this, s.
    frozen_hold_s: float
    # Heatsink rise over the room at nameplate power, °C (P_max · R_ha); 0 leaves the slow node out.
    sink_rise_c: float = 0.0
    # Heatsink time constant, s.
    sink_tau_s: float = 60.0
    # Shortest unchanged run that may start a probe, s (a noisy sensor's history shortens the wait to this).
    # Probes dip a live die: at 60 s the nominal plant with a 3 s delay reached 1.8 °C peak-to-peak over 24 h.
    min_probe_after_s: float = 120.0
    # The same when the reading climbed 3 °C or more in the minute before it stalled (a warming die), s.
    climb_probe_after_s: float = 20.0
    # Shortest unchanged run after which the budget may not rise, s.
    min_hold_s: float = 8.0


@dataclass(frozen=True)
class FrozenCheck:
    """The detector's verdict on one sample."""

    # False when the sensor is judged stuck (the sample must not be used).
    ok: bool
    # Why it is stuck ('' when ok).
    reason: str = ""
    # During a probe: the busy fraction the duty must not exceed; None otherwise.
    probe_cap: float | None = None
    # Whether the governor may raise its budget on this sample.
    may_raise: bool = True
    # The reading arrived by a jump and has not moved on its own since: hold the duty, even when cool.
    suspect: bool = False


class FrozenDetector:
    """Tracks one reading stream; call :meth:`check` once per valid sample, :meth:`skip` once per failed one."""

    UNSEEN_SLACK_C = 0.5

    def __init__(self, settings: FrozenSettings) -> None:
        self.s = settings
        self._value: float | None = None
        self._changed_t = 0.0
        # The two model nodes are kept as low-passed power, W, and turned into °C with the current watts per full
        # duty (_per_w): learning that figure rescales the whole model, never moves it against its references.
        self._model: float | None = None
        self._warm_until = 0.0
        self._model_ref = 0.0
        self._sink: float | None = None
        self._sink_ref = 0.0
        self._seed: tuple[float, float] | None = None  # (die, heatsink) to start from instead of the first power
        self._per_w = 1.0 / settings.p_max_w
        self._expect_since: float | None = None
        self._last_t: float | None = None
        self._stuck_value: float | None = None
        self._probe_t: float | None = None
        self._probe_busy = 0.0
        self._runs: deque[float] = deque(maxlen=64)
        self._changes: deque[tuple[float, float]] = deque(maxlen=64)
        self._after_probe = False
        self._probe_ref = 0.0
        self._backoff = 1.0
        self._gap_in_run = False  # a read failed during the current unchanged run: its length is no flicker
        self._suspect = False
        self.probes = 0
        """Probes started so far."""

    @property
    def stuck(self) -> bool:
        """Whether the sensor is judged stuck now."""
        return self._stuck_value is not None

    @property
    def probing(self) -> bool:
        """Whether a probe is running."""
        return self._probe_t is not None

    def skip(self, now: float, power: float, full_w: float | None = None) -> None:
        """A sample without a usable reading (failed, implausible, or a rejected jump): the model runs on.

        The reference reading, the time it last changed, the model's change since then and a running probe are
        all kept: a gap says nothing about whether the sensor moved (see the module docstring, point 5).
        """
        self._advance(now, power, full_w)
        self._gap_in_run = True

    def _advance(self, now: float, power: float, full_w: float | None) -> None:
        """Integrate the two model nodes up to ``now`` on the measured power."""
        s = self.s
        dt = 0.0 if self._last_t is None else min(max(now - self._last_t, 0.0), 5.0)
        self._last_t = now
        self._per_w = 1.0 / (full_w if full_w is not None and full_w > 0.0 else s.p_max_w)
        if self._model is None or self._sink is None:  # start: the model needs a few time constants to be trusted
            # seeded by a restart: no lower than the first power, which says whether the GPU idled meanwhile (a
            # heatsink model seeded cool under a GPU that had run climbed, and the fall bound made each true reading a
            # jump: 171 s of false BLIND; held-out review, session 22)
            self._model = power if self._seed is None else max(self._seed[0], power)
            self._sink = power if self._seed is None else max(self._seed[1], power)
            self._warm_until = now + 3.0 * s.die_tau_s + s.sensor_delay_s
        self._model += (power - self._model) * min(dt / s.die_tau_s, 1.0)
        self._sink += (power - self._sink) * min(dt / s.sink_tau_s, 1.0)

    def _typical_run_s(self) -> float | None:
        """The longest of the last 8 unchanged runs (None until 8 are known).

        recent, so that a reading that was moving every few seconds (a warming die) and then stops is suspect quickly.
        """
        if len(self._runs) < 8:
            return None
        return max(list(self._runs)[-8:])

    def _hold_allowance_s(self) -> float:
        """How much longer than one sample the sensor holds a value even while the die moves, s (point 8).

        The shortest of the last 8 natural unchanged runs: about one sample for a sensor that updates every read,
        the update period for one that samples and holds (every 10 s: judged stuck half the run, 75.6 °C; held-out
        review, session 14). Capped at 10 s, so a frozen sensor is still caught within the sensor delay + 10 s.
        """
        if len(self._runs) < 8:
            return 0.0
        return min(max(min(list(self._runs)[-8:]) - 1.0, 0.0), 10.0)

    def _climbed_c(self, span_s: float = 60.0) -> float:
        """How far the reading rose over the ``span_s`` before its last change, °C."""
        if not self._changes:
            return 0.0
        t_last, v_last = self._changes[-1]
        older = [v for t, v in self._changes if t_last - t <= span_s]
        return v_last - min(older)

    def _mark(self, now: float, temp: float, power: float, natural: bool = False) -> None:
        # runs that a probe cut short, and the one right after (the reading bouncing back), say nothing
        # about the sensor's own flicker; a live answer to a probe doubles the wait for the next one
        if self._probe_t is not None:
            self._backoff = min(self._backoff * 2.0, 64.0)
        elif natural and not self._after_probe and not self._gap_in_run:
            self._runs.append(now - self._changed_t)
            self._backoff = 1.0
            self._changes.append((now, temp))
        self._after_probe = self._probe_t is not None
        self._gap_in_run = False
        self._value = temp
        self._changed_t = now
        self._model_ref = self._model if self._model is not None else 0.0
        self._sink_ref = self._sink if self._sink is not None else 0.0
        self._expect_since = None
        self._probe_t = None

    def unseen_rise(self) -> float:
        """Return how far the model says the die has risen unseen, °C (>= 0).

        How far the two-node model (die and heatsink) says the die has risen since the reading last changed,
        beyond one quantisation step, °C (>= 0). The governor adds it to the reading it regulates
        on, so a reading that stalls while the model says the die keeps warming is not believed blindly.
        """
        if self._model is None or self._sink is None or self._value is None:
            return 0.0
        return max(self._total_change_c() - self.UNSEEN_SLACK_C, 0.0)

    def seed(self, die_w: float, sink_w: float) -> None:
        """Start the two nodes at these powers, or the first power where that is higher (a restart on a warm GPU)."""
        self._seed = (die_w, sink_w)

    def sink_model(self) -> tuple[float, float]:
        """The heatsink node as low-passed power, W, and °C per W of its change (0 without a heatsink rise)."""
        sink = self._sink if self._sink is not None else self._seed[1] if self._seed is not None else 0.0
        return sink, self.s.sink_rise_c * self._per_w

    def _die_c(self, delta_w: float) -> float:
        return self.s.die_rise_c * delta_w * self._per_w

    def _total_change_c(self) -> float:
        """How far the modelled die (die node + heatsink node) moved since the reading last changed, °C."""
        if self._model is None or self._sink is None:
            return 0.0
        sink_c = self.s.sink_rise_c * (self._sink - self._sink_ref) * self._per_w
        return self._die_c(self._model - self._model_ref) + sink_c

    def _waits(self) -> tuple[float, float]:
        """How long the reading may stay unchanged before the budget is held, and before a probe starts, s."""
        s = self.s
        if self._suspect:  # arrived by a jump and never moved since: probe soon, never raise
            return 0.0, s.climb_probe_after_s
        typical = self._typical_run_s()
        if typical is None:
            return s.frozen_hold_s, s.probe_after_s
        # a reading that was climbing and stops is more suspect than one that dithered
        floor = s.climb_probe_after_s if self._climbed_c() >= 3.0 else s.min_probe_after_s
        return (min(max(2.0 * typical, s.min_hold_s), s.frozen_hold_s),
                min(max(3.0 * typical * self._backoff, floor), s.probe_after_s))

    def _judged_fall(self, now: float, expect: float, paused: bool) -> float:
        """The fall the model expects that a probe (or a pause) judges the reading on, °C (<= 0; 0 when none)."""
        s = self.s
        assert self._model is not None
        # Only a rise is judged outside a probe: a frozen reading while the power falls is the safe direction,
        # and a slowly warming heatsink or room can hold a live die still while the power eases off.
        # a probe is judged on its own effect: the fall the model expects since the probe began
        probe_fall = self._die_c(self._model - self._probe_ref) if self._probe_t is not None else 0.0
        # and, with the heatsink modelled, on the whole fall since the reading last changed: a reading frozen above
        # the target sees the PI wind the power down for minutes before the probe, which a probe-only reference
        # misses; the slow node accounts for a warming heatsink that could hold a live die still meanwhile
        # (only once the reading has been still for a heatsink time constant: right after a climb from idle the
        # real heatsink lags the one-node model, whose fan-on time constant is shorter than the warm-up's, and the
        # model's "fall" is heat the heatsink is still taking up; rand23-7 went BLIND falsely in every column)
        if self._probe_t is not None and s.sink_rise_c > 0.0 and now - self._changed_t >= s.sink_tau_s:
            total_fall = self._total_change_c()
            if total_fall <= -2.0 * s.probe_expect_c:
                probe_fall = min(probe_fall, total_fall)
        if paused:  # dispatch stopped or at its floor: a probe as deep as it gets, judged on the die node's fall
            probe_fall = min(probe_fall, expect)
        return probe_fall

    def check(self, now: float, temp: float, power: float, busy: float, can_probe: bool,
              full_w: float | None = None, *, jumped: bool = False, paused: bool = False) -> FrozenCheck:
        """Judge one plausible sample.

        Args:
            now: Sample time, s.
            temp: The reading, °C.
            power: Average power over the last period, W.
            busy: Busy fraction the batcher used over the last period.
            can_probe: Whether the governor is in normal operation (cool, regulating or throttling).
            full_w: Watts of a full duty above idle as the governor has learned them (default: the settings'
                ``p_max_w``); the rises are per full power.
            jumped: The reading was accepted only after a rejected jump (see the module docstring, point 6).
            paused: Dispatch is paused or held at its minimum (EMERGENCY, or the duty at its floor): the die must
                fall, so a fall the model expects is judged like a probe's (module docstring, point 7).
        """
        s = self.s
        self._advance(now, power, full_w)
        assert self._model is not None
        if self._stuck_value is not None:
            if temp == self._stuck_value:
                return FrozenCheck(False, "stuck: reading frozen")
            self._stuck_value = None
            self._suspect = jumped
            self._mark(now, temp, power)
            return FrozenCheck(True, may_raise=not jumped, suspect=jumped)
        changed = self._value is not None and temp != self._value
        if changed:
            self._suspect = jumped
        if self._value is None or changed or now < self._warm_until:
            self._mark(now, temp, power, changed and not jumped)
            if self._suspect:
                return FrozenCheck(True, may_raise=False, suspect=True)
            return FrozenCheck(True)
        expect = self._die_c(self._model - self._model_ref)
        probe_fall = self._judged_fall(now, expect, paused)
        if expect >= s.stuck_expect_c or probe_fall <= -s.probe_expect_c:
            if self._expect_since is None:
                self._expect_since = now
            if now - self._expect_since >= s.sensor_delay_s + self._hold_allowance_s():
                judged_fall = self._probe_t is not None or paused and probe_fall <= -s.probe_expect_c
                why = ("probe changed nothing" if self._probe_t is not None
                       else "dispatch paused, reading did not fall" if judged_fall else "power rose, reading did not")
                shown = probe_fall if judged_fall else expect
                self._stuck_value = temp
                self._probe_t = None
                return FrozenCheck(False, f"stuck: {why} ({shown:+.1f} °C expected)")
        else:
            self._expect_since = None
        frozen_s = now - self._changed_t
        hold_s, probe_after_s = self._waits()
        may_raise = frozen_s < hold_s
        if self._probe_t is None:
            if frozen_s >= probe_after_s and can_probe and busy >= 0.2:
                self._probe_t = now
                self._probe_busy = busy
                self._probe_ref = self._model
                self.probes += 1
        if self._probe_t is not None:
            cut = min(s.probe_rate * (now - self._probe_t + 1.0), s.probe_max_cut)
            if cut >= s.probe_max_cut and now - self._probe_t > s.probe_max_cut / s.probe_rate + 4 * s.die_tau_s:
                self._mark(now, temp, power)  # inconclusive (the power did not follow): re-arm
                return FrozenCheck(True, may_raise=False, suspect=self._suspect)
            return FrozenCheck(True, probe_cap=self._probe_busy * (1.0 - cut), may_raise=False, suspect=self._suspect)
        return FrozenCheck(True, may_raise=may_raise, suspect=self._suspect)
