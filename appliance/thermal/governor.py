"""The thermal governor: a pure PI controller in the power domain, wrapped in a fail-safe.

The governor turns one temperature sample per control period into a pacing *duty* in [0, 1]: the
fraction of wall time the batcher may keep the GPU computing. It does no I/O and reads no clock, so
tests, benchmarks and outside tools drive it against their own plants::

    from appliance.governor import Governor, ThermalConfig
    gov = Governor(ThermalConfig())
    duty = gov.update(now_s, temp_c, power_w=None, busy=None)
    gov.state          # GovernorState.THROTTLING, ...
    gov.last_decision  # Decision(duty, budget_w, state, reason, headroom, ...)

Design (``docs/thermal.md``, "Governor design", each point there with its figures):

- A PI law in the power domain: budget ``I + Kp·e``, duty ``(budget − P_idle) / W_per_duty`` with ``W_per_duty``
  learned from measured power (:mod:`~appliance.thermal.boardpower`) and the busy fraction; Kp gentler below the
  setpoint than above. Anti-windup by conditional integration; below switch-on the integrator is frozen, never
  reset, and :meth:`Governor.resume` carries it (and the models) across a restart of the daemon ("Restarts").
- On the reading: delay compensation (the lead of a power-driven die model), a noise filter for the P term, a
  swing margin for loads that come and go within seconds, and a live boost while the sensor is demonstrably live
  (:mod:`~appliance.thermal.diemodel`, :mod:`~appliance.thermal.boost`).
- A guard at ``guard_c`` caps the budget, escalating while readings climb past it (:mod:`~appliance.thermal.guard`;
  "hot at the floor" lets the duty under ``min_duty``).
- Which readings to believe: a vote of recent readings, the jump test, and a fall bound that takes a believed
  reading no lower than the models allow (:mod:`~appliance.thermal.plausible`).
- The fail-safe: read errors hold the last duty ≤ ``hold_s`` then fall to ``blind_duty`` until ``recover_samples``
  good samples; a frozen plausible reading is judged by :mod:`~appliance.thermal.sensorcheck` and goes BLIND; a lost
  GPU stops dispatch for good (``STOPPED``); ``emergency_c`` for ``emergency_s`` at minimum duty pauses dispatch.
"""

from __future__ import annotations

import math

from appliance.thermal.boardpower import BoardPower
from appliance.thermal.boost import LiveBoost
from appliance.thermal.diemodel import DieModel
from appliance.thermal.guard import Guard
from appliance.thermal.memory import Learned
from appliance.thermal.params import Decision, GovernorState, ThermalConfig
from appliance.thermal.plausible import FallBound, ReadingVote
from appliance.thermal.sensorcheck import FrozenCheck, FrozenDetector, FrozenSettings

__all__ = ["Decision", "Governor", "GovernorState", "ThermalConfig"]

_ERROR_KINDS_LOST = frozenset({"lost", "reset_required"})
#: Why a plausible reading was rejected as a glitch (not a failed read, an out-of-range value or a stuck verdict).
_GLITCH_KINDS = frozenset({"implausible jump", "implausible: outvoted"})

#: Reasons for a duty held under the PI's output by a cap (the integrator does not rise behind one).
_CAPS = frozenset({"recovery ramp", "stuck probe", "suspect jump: hold"})


class Governor:
    """PI-in-power-domain thermal governor with a built-in fail-safe. Pure: no I/O, no clock.

    Args:
        config: The settings; ``ThermalConfig()`` gives the documented defaults.
    """

    def __init__(self, config: ThermalConfig | None = None) -> None:
        self.config = config or ThermalConfig()
        c = self.config
        self._state = GovernorState.COOL
        self._duty = 1.0
        self._integral: float | None = None  # W; None until first activation (bumpless start)
        self._die = DieModel(c)  # learned watts per duty, die model, delay compensation, reading filter
        self._last_t: float | None = None
        self._last_good_t: float | None = None
        self._last_good_temp: float | None = None
        self._error_since: float | None = None
        self._good_run = 0
        self._blind_reason = ""
        self._blind_cause = ""
        # (since, duty, ramp start or None) while a stuck verdict holds
        self._stuck: tuple[float, float, float | None] | None = None
        self._board = BoardPower(c.p_idle_w)  # energy counter, else power reading, else the duty model
        self._frozen = FrozenDetector(FrozenSettings(
            c.die_rise_c, c.nameplate_w, c.die_tau_s, c.sensor_delay_s, c.stuck_expect_c, c.probe_expect_c,
            c.probe_after_s, c.probe_rate, c.probe_max_cut, c.frozen_hold_s, c.sink_rise_c, c.sink_tau_s))
        self._check = FrozenCheck(True)
        self._boost = LiveBoost(c)
        self._ramp_cap: float | None = None
        self._resumed = False  # the budget came from a memory: the first PI step takes no more than a fresh start
        self._hot_since: float | None = None
        self._jump_run: list[float] = []
        self._jumped_hot = False  # the last rejected jump went up, to the switch-on temperature or above
        self._guard = Guard(c)  # readings at or past guard_c cap the budget
        self._vote = ReadingVote(c.max_jump_c_per_s * c.period_s, max(c.recover_samples, 3),  # a majority needs 3
                                 2.0 * max(c.recover_samples, 3) * c.period_s)
        self._fall = FallBound(c.fall_margin_c, c.fall_rate_c_per_s, c.period_s, doubt_margin_c=c.fall_doubt_margin_c)
        self._sensor_c: float | None = None  # this sample's reading as the sensor gave it (status shows it)
        self.sensor_errors = 0
        """Samples rejected so far (missing, implausible or stuck)."""
        self.last_decision = Decision(0.0, 1.0, None, GovernorState.COOL, "start", None, None, None)
        """The most recent :class:`Decision`."""

    # ------------------------------------------------------------------ public
    @property
    def state(self) -> GovernorState:
        """The current :class:`GovernorState`."""
        return self._state

    @property
    def duty(self) -> float:
        """The duty returned by the last update."""
        return self._duty

    @property
    def boost_c(self) -> float:
        """The live boost now added to ``setpoint_c``, °C (0 whenever the sensor is not demonstrably live)."""
        return self._boost.value

    def lead_c(self) -> float:
        """What the die model says the die did over the last sensor delay, °C (the delay compensation)."""
        return self._die.lead_c()

    @property
    def integral_w(self) -> float | None:
        """The PI integrator, W (the learned sustainable budget); None before first activation."""
        return self._integral

    def learned(self) -> Learned:
        """What this governor learned that a restarted one may start from (:mod:`appliance.thermal.memory`)."""
        die = self._die.now_w
        sink = self._frozen.sink_model()[0] if die is not None else None
        idle = self.config.p_idle_w
        return Learned(self._integral, self._die.w_per_duty, idle if die is None else die, sink or idle)

    def resume(self, learned: Learned, away_s: float) -> None:
        """Start from what the governor before a restart learned, ``away_s`` ago (before the first update).

        The budget and the watts per duty carry over as they are: the PI never resets them through idle hours
        either. The die and heatsink models cool toward idle power over the time away, as the GPU did with no
        daemon feeding it (docs/thermal.md, "Restarts").
        """
        if self._last_t is not None:
            raise RuntimeError("Governor.resume() must come before the first update()")
        c = self.config
        idle = c.p_idle_w
        self._die.w_per_duty = min(max(learned.w_per_duty, 0.25 * c.nameplate_w), 2.0 * c.nameplate_w)

        def cooled(watts: float, tau_s: float) -> float:
            return idle + (watts - idle) * math.exp(-max(away_s, 0.0) / tau_s)

        die = cooled(learned.die_w, c.die_tau_s)
        self._die.seed(die)
        self._frozen.seed(die, cooled(learned.sink_w, c.sink_tau_s))
        if learned.integral_w is not None:
            w = self._die.w_per_duty
            self._integral = min(max(learned.integral_w, idle + c.min_duty * w), idle + w)
            self._resumed = True

    def update(
        self,
        now_s: float,
        temp_c: float | None,
        power_w: float | None = None,
        busy: float | None = None,
        *,
        energy_j: float | None = None,
        error: str | None = None,
    ) -> float:
        """Feed one sample and return the duty for the next period.

        Args:
            now_s: Monotonic time of the sample, s. Calls come about once per second.
            temp_c: GPU temperature reading, °C; None when the read failed.
            power_w: Measured average power over the last period, W, if known.
            busy: Fraction of the last period the engine actually computed, if known.
            energy_j: Cumulative energy counter, J; its delta gives exact average power.
            error: Error kind of a failed read (``"lost"``/``"reset_required"`` stop at once;
                anything else counts as a read error).

        Returns:
            The duty in [0, 1]: 0 when STOPPED or in EMERGENCY; under min_duty only while the guard holds a die
            that is hot at min_duty ("hot at the floor"); else in [min_duty, 1].
        """
        c = self.config
        dt = c.period_s if self._last_t is None else min(max(now_s - self._last_t, 0.0), 3.0 * c.period_s)
        self._last_t = now_s
        if self._state is GovernorState.STOPPED or (error is not None and error in _ERROR_KINDS_LOST):
            return self._decide(now_s, 0.0, None, GovernorState.STOPPED, f"gpu {error or 'lost'}", None, None)

        power, measured = self._board.sample(now_s, dt, power_w, energy_j, self._duty if busy is None else busy,
                                             self._die.w_per_duty)
        self._die.advance(now_s, power, dt)
        # the load's use of the duty, while the PI paced it (from COOL, a load arriving on a cool die is no swing)
        self._die.note_use(now_s, busy, self._duty, dt,
                           paced=self._state in (GovernorState.REGULATING, GovernorState.THROTTLING))
        if busy is not None and measured is not None:
            self._die.learn(measured, busy, self._board.trust)
        temp, why = self._validate(now_s, temp_c, error)
        if temp is not None:
            used = self._duty if busy is None else busy
            normal = self._state in (GovernorState.COOL, GovernorState.REGULATING, GovernorState.THROTTLING)
            paused = self._state is GovernorState.EMERGENCY or (
                self._state is GovernorState.THROTTLING and self._duty <= c.min_duty + 1e-9)
            self._check = self._frozen.check(now_s, temp, power, used, normal, self._die.full_w(), jumped=why == "jump",
                                             paused=paused)
            if not self._check.ok:
                self._blind_reason = self._check.reason
                temp, why = None, "stuck"
        else:
            self._frozen.skip(now_s, power, self._die.full_w())  # a gap is not a change (sensorcheck, point 5)
            self._check = FrozenCheck(True)
        if temp is None:
            if why in _GLITCH_KINDS:
                self._fall.doubt(now_s)  # the sensor lies now and then: take believed readings closer to the envelope
            if why == "implausible: outvoted" and temp_c is not None:
                self._fall.observe(now_s, float(temp_c), *self._models())  # the hotter stream is the safe one
            return self._on_bad_sample(now_s, why, power)
        self._sensor_c = temp
        if why == "unconfirmed":
            return self._on_good_sample(now_s, temp, power, busy, dt, reference=None)
        # no colder than the recent readings and the models allow (docs/thermal.md, point 9); the bounded value is
        # also the next jump test's reference, so a glitch let through low does not make the true readings "jumps"
        models, per_w = self._models()
        if why == "jump" and (temp > (self._last_good_temp or temp)
                              or self._fall.modelled_change(models, per_w) <= -self.config.fall_margin_c):
            # a confirmed jump up, or down while the power fell (the die really cooled during an outage), starts it
            # again; a run of low glitches confirmed as a jump at steady power must not erase it (session 15 review)
            self._fall.reset()
        bounded = self._fall.bound(now_s, temp, models, per_w)
        # a confirmed jump is the next test's reference itself (or the same reading would be a jump again, for good)
        return self._on_good_sample(now_s, bounded, power, busy, dt, reference=temp if why == "jump" else bounded)

    def _models(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """The die (delayed) and heatsink models as low-passed power, W, and °C per W of each (for the fall bound)."""
        sink_w, sink_c_per_w = self._frozen.sink_model()
        return (self._die.then, sink_w), (self._die.model_c(1.0), sink_c_per_w)

    # ------------------------------------------------------------- sampling
    def _validate(self, now_s: float, temp_c: float | None, error: str | None) -> tuple[float | None, str]:
        c = self.config
        if temp_c is None or error is not None:
            return None, error or "read_error"
        if not math.isfinite(temp_c) or not c.plausible_min_c <= temp_c <= c.plausible_max_c:
            return None, "implausible value"
        believed = self._vote.believed(now_s, float(temp_c))  # a majority of recent readings (docs/thermal.md, 8)
        if self._last_good_temp is None:
            if believed:
                return float(temp_c), ""
            # the very first reading is used, but is no reference until another agrees; later ones are outvoted
            return (float(temp_c), "unconfirmed") if self._vote.alone else (None, "implausible: outvoted")
        if abs(temp_c - self._last_good_temp) > c.max_jump_c_per_s * c.period_s:
            # A jump is believed only once recover_samples readings in a row agree with each other
            # (after a long outage the die may really have moved); until then it is an error.
            prev = self._jump_run[-1] if self._jump_run else None
            if prev is None or abs(temp_c - prev) > c.max_jump_c_per_s * c.period_s:
                self._jump_run = []
            self._jump_run.append(float(temp_c))
            if len(self._jump_run) < c.recover_samples:
                self._jumped_hot = temp_c > self._last_good_temp and temp_c >= c.switch_on_c
                return None, "implausible jump"
            self._jump_run = []
            return float(temp_c), "jump"  # believed, but suspect until it moves on its own (sensorcheck, point 6)
        if not believed and not self._vote.alone:  # agrees with the reference, not with most recent readings:
            return None, "implausible: outvoted"  # a glitch stream that once won; a run of jumps goes on
        self._jump_run = []
        return float(temp_c), ""

    # ------------------------------------------------------------- decisions
    def _on_bad_sample(self, now_s: float, why: str, power: float) -> float:
        c = self.config
        self.sensor_errors += 1
        # a rejected glitch costs a recovering BLIND one good sample, not all of them: a spike every 5 s kept the
        # governor BLIND for good (held-out review, session 14); a failed read or a stuck verdict starts again
        # (an out-of-range value, 255 °C or NaN, is a failing sensor rather than a glitch: it starts again too)
        self._good_run = max(self._good_run - 1, 0) if why in _GLITCH_KINDS else 0
        if self._error_since is None:
            self._error_since = now_s
        self._hot_since = None
        if why == "stuck" or self._state is GovernorState.BLIND or now_s - self._error_since >= c.hold_s:
            self._boost.withdraw()
        if why == "stuck":
            if self._stuck is None:  # never above the blind duty or what BLIND already held
                if self._state is GovernorState.BLIND:
                    self._stuck = (now_s, min(c.blind_duty, self._duty), None)
                else:  # a duty under the blind duty was low for a reason (a hot die): ramp up to it, never jump
                    self._stuck = (now_s, c.blind_duty, self._duty if self._duty < c.blind_duty else None)
            self._blind_cause = "stuck"
            return self._decide(now_s, self._stuck_duty(now_s), None, GovernorState.BLIND, self._blind_reason,
                                None, power)
        if self._state is not GovernorState.BLIND and now_s - self._error_since < c.hold_s:
            held = self._duty if self._state is not GovernorState.EMERGENCY else 0.0
            if why == "implausible jump" and self._jumped_hot:  # if it is real the die is warm: never hold more
                held = min(held, c.blind_duty)  # than the blind duty (a cool start on low glitches held full duty)
            return self._decide(now_s, held, None, GovernorState.HOLDING, f"{why}: hold", None, power)
        read_failure = not why.startswith("implausible")
        if self._state is not GovernorState.BLIND:
            self._blind_cause = "read" if read_failure else "implausible"
        elif not read_failure:
            self._blind_cause = "implausible"
        return self._decide(now_s, c.blind_duty, None, GovernorState.BLIND, f"{why}: blind", None, power)

    def _stuck_duty(self, now_s: float) -> float:
        """The duty while a reading is judged stuck: the blind duty, dipped now and then.

        A live sensor that happens to read its frozen value again (a quiet die settled at the blind duty) then
        shows a change. Every ``stuck_dip_every_s`` the duty drops by ``probe_max_cut`` for ``stuck_dip_s``;
        lower duty is always the safe direction, so a sensor that really is stuck costs only that throughput.
        """
        assert self._stuck is not None
        c = self.config
        since, duty, start = self._stuck
        age = now_s - since
        if start is not None:
            duty = min(duty, start + c.recover_ramp_per_s * age)
        if c.stuck_dip_every_s > 0 and age >= c.stuck_dip_every_s and age % c.stuck_dip_every_s < c.stuck_dip_s:
            return max(duty * (1.0 - c.probe_max_cut), c.min_duty)
        return duty

    def _on_good_sample(self, now_s: float, temp: float, power: float, busy: float | None, dt: float, *,
                        reference: float | None) -> float:
        """Decide on a believed sample: ``temp`` to regulate on, ``reference`` what the next jump test compares with.

        The first reading after start is used once but is no reference until another agrees (``reference`` None).
        """
        c = self.config
        self._stuck = None
        if reference is not None:
            self._last_good_t = now_s
            self._last_good_temp = reference
        headroom = min(max((c.limit_c - temp) / (c.limit_c - c.switch_on_c), 0.0), 1.0)
        if self._state in (GovernorState.BLIND, GovernorState.HOLDING):
            self._good_run += 1
            needed = c.recover_samples
            if (self._blind_cause == "read" and self._error_since is not None
                    and now_s - self._error_since <= c.short_outage_s):
                needed = min(needed, 2)  # a brief read outage: the sensor itself was never in doubt
            if self._state is GovernorState.BLIND and self._good_run < needed:
                # a reading judged stuck that moves is live again, and the blind duty is a guess for an unknown die,
                # not for one this hot (a glitch-ridden sensor's hot readings are not trusted that far)
                hot = self._blind_cause == "stuck" and temp >= c.guard_c
                return self._decide(now_s, c.min_duty if hot else c.blind_duty, None, GovernorState.BLIND,
                                    f"recovering {self._good_run}/{needed}", headroom, power, temp)
            if self._state is GovernorState.BLIND:
                # the die cooled at the blind duty, so the PI would jump to full duty; one more read error would
                # then hold that jump for hold_s on a die the sensor has not seen yet: ramp up instead
                self._ramp_cap = c.blind_duty
        self._error_since = None
        if self._emergency(now_s, temp):
            return self._decide(now_s, 0.0, None, GovernorState.EMERGENCY, "emergency pause", headroom,
                                power, temp)
        if temp < c.switch_on_c:
            cap = self._check.probe_cap
            if cap is not None and cap < 1.0:
                return self._decide(now_s, max(cap, c.min_duty), None, GovernorState.COOL, "stuck probe", headroom,
                                    power, temp)
            if self._check.suspect:  # a cool reading that came by a jump: keep the duty until it moves on its own
                return self._decide(now_s, max(self._duty, c.min_duty), None, GovernorState.COOL, "suspect jump: hold",
                                    headroom, power, temp)
            return self._decide(now_s, 1.0, None, GovernorState.COOL, "cool", headroom, power, temp)
        return self._pi(now_s, temp, power, busy, dt, headroom)

    def _emergency(self, now_s: float, temp: float) -> bool:
        c = self.config
        if self._state is GovernorState.EMERGENCY:
            if temp <= c.setpoint_c:
                self._hot_since = None
                return False
            return True
        if temp >= c.emergency_c and self._duty <= c.min_duty + 1e-9:
            if self._hot_since is None:
                self._hot_since = now_s
            return now_s - self._hot_since >= c.emergency_s
        self._hot_since = None
        return False

    def _pi(self, now_s: float, temp: float, power: float, busy: float | None, dt: float,
            headroom: float) -> float:
        """Run the PI law in the power domain and convert the budget to duty.

        NOTE: the integrator only moves up while the batcher used its allowance (``busy``) and the
        output is not saturated at 1; it only moves down while the output is above its floor. It is
        never reset, so the learned sustainable budget survives idle hours and blind periods.
        """
        c = self.config
        w = self._die.w_per_duty
        p_lo = c.p_idle_w + c.min_duty * w
        p_hi = c.p_idle_w + w
        reading = temp
        unseen = self._frozen.unseen_rise()
        ahead = unseen + self._die.lead_c()
        temp = reading + ahead  # the integrator and the guard act on this
        filtered = self._die.filter(now_s, reading, dt) + ahead  # the P term and the settle test act on this
        boost = self._boost.update(filtered, reading, unseen, dt,
                                   may_raise=self._check.may_raise and self._check.probe_cap is None)
        # the load's swing lowers the target: the die's peaks stand above the mean the readings show (session 20)
        target = c.setpoint_c + boost - self._die.swing_c()
        e = target - temp
        e_p = target - filtered

        # Gains are set for the nameplate card; scale them with the learned watts per duty so the
        # loop gain stays put on a smaller or larger GPU (P_max·R_jh is ≈ 13–14 °C across classes).
        def gain(err: float) -> float:
            return (c.kp_cool_w_per_c if err >= 0 else c.kp_hot_w_per_c) * w / c.nameplate_w

        kp = gain(e_p)
        used = 1.0 if busy is None else busy
        if self._integral is None or self._resumed:  # bumpless start at the measured power
            # a start already at the setpoint with no power measured yet (a restart on a hot GPU) assumes the blind
            # duty, not full power: from full power a restart at 74 °C into full demand passed 75 °C (session 14)
            guessed = not self._board.measured and temp >= c.setpoint_c
            base = power if used >= 0.5 and not guessed else c.p_idle_w + c.blind_duty * w
            fresh = min(max(base - kp * e_p, p_lo), p_hi)
            if self._integral is None:
                self._integral = fresh
            elif used >= 0.5 and self._board.measured:
                # a remembered budget may come from a cooler room or a healthier fan: if the load uses half its
                # allowance at the first PI step, no more than a fresh start's (room 15 °C warmer or the fan at 40 %
                # while no daemon ran: 4-7 of 128 plants above 75 °C, up to 75.59 °C; held-out review, session 22)
                self._integral = min(self._integral, fresh)
            self._resumed = False
        di = gain(e) / c.ti_s * e * dt
        saturated_hi = self._duty >= 1.0 - 1e-9
        used_allowance = busy is None or busy >= self._duty - c.busy_slack
        may_raise = used_allowance and not saturated_hi and self._check.may_raise
        before = self._integral
        if di > 0 and may_raise or di < 0 and self._duty > c.min_duty + 1e-9:
            self._integral = min(max(self._integral + di, p_lo), p_hi)
        budget = self._integral + kp * e_p
        reason = "pi"
        hot = self._guard.hot(reading, max(temp, filtered))
        # a die still at the guard with the duty at its floor: min_duty is no safe duty for it (a stopped fan), so the
        # PI may go under it to 0 until the reading falls (docs/thermal.md, "Hot at the floor")
        floor = 0.0 if hot and self._duty <= c.min_duty + 1e-9 else c.min_duty
        if hot and budget > (cap := self._guard.cap_w(power)):
            budget = cap
            reason = "guard"
            if self._guard.capped():  # a sustained guard: wind the integrator down
                self._integral = max(min(self._integral, cap), p_lo)
        else:
            self._guard.released()
        if floor < c.min_duty and budget < p_lo:
            reason = "hot at the floor"
        duty, reason = self._capped(min(max((budget - c.p_idle_w) / w, floor), 1.0), reason, dt)
        if reason in _CAPS and self._integral > before:
            # a capped output is a saturated one: integrating up behind the cap wound the budget to full during a
            # recovery ramp, and the PI then took over at full duty on a die still warming (session 15)
            self._integral = before
        state = GovernorState.THROTTLING if duty < 1.0 - 1e-9 else GovernorState.REGULATING
        return self._decide(now_s, duty, budget, state, reason, headroom, power, temp)

    def _capped(self, duty: float, reason: str, dt: float) -> tuple[float, str]:
        """Apply the caps on the PI's duty: the recovery ramp, a stuck probe, a suspect jump's hold."""
        c = self.config
        if self._ramp_cap is not None:
            self._ramp_cap += c.recover_ramp_per_s * dt
            if duty > self._ramp_cap:
                duty, reason = self._ramp_cap, "recovery ramp"
            else:
                self._ramp_cap = None
        if self._check.probe_cap is not None and duty > self._check.probe_cap:
            duty, reason = max(self._check.probe_cap, c.min_duty), "stuck probe"
        elif self._check.suspect and duty > self._duty:  # a reading that came by a jump never raises the duty
            duty, reason = max(self._duty, c.min_duty), "suspect jump: hold"
        return duty, reason

    def _decide(self, now_s: float, duty: float, budget: float | None, state: GovernorState, reason: str,
                headroom: float | None, power: float | None, temp: float | None = None) -> float:
        self._duty = duty
        self._state = state
        # a decision on a good sample (temp set) shows that sample's reading as the sensor gave it
        self.last_decision = Decision(now_s, duty, budget, state, reason, headroom, temp, power,
                                      self._sensor_c if temp is not None else None)
        return duty
