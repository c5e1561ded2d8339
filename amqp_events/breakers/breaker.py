"""Per-handler circuit breakers: when a handler keeps failing, stop taking its messages for a while.

Pure state machines, no I/O: the worker (:mod:`amqp_events.breakers`)
feeds them outcomes and the time, and pauses or resumes consumption of the
handler's queue on the transitions they return.

* **closed**: messages flow; unexpected failures are counted in a sliding
  window. ``failures`` of them within ``window`` seconds (or, with
  ``ratio``, that share of at least ``min_messages`` outcomes) trips it.
* **open**: the worker stops consuming the handler's queue; its messages
  stay on the broker, in order. After ``open_for`` seconds (growing
  ``linear``-ly or ``exponential``-ly with consecutive trips, up to
  ``open_max``) it turns half-open.
* **half-open**: consumption resumes; the next outcome closes it (success)
  or opens it again (failure).

An operator (``amqp-events breakers open HANDLER``) or an unhealthy health
check holds a breaker open whatever the outcomes, until released.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class State(IntEnum):
    """A breaker's state; the values are those of the ``amqp_events_breaker_state`` gauge."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2

    def __str__(self) -> str:
        return self.name.lower().replace("_", "-")


GROWTHS = ("fixed", "linear", "exponential")


@dataclass(frozen=True)
class BreakerPolicy:
    """When a breaker trips and how long it stays open (the Celery 5 design's defaults)."""

    failures: int = 3
    window: float = 60.0
    #: Trip on this share of failures (0 < ratio <= 1) among at least ``min_messages`` outcomes in the window.
    ratio: float | None = None
    min_messages: int = 10
    open_for: float = 30.0
    #: How the open period grows with consecutive trips: fixed, linear or exponential, up to ``open_max``.
    growth: str = "fixed"
    open_max: float = 600.0
    #: Trips within ``escalate_window`` seconds that turn the trip log from a warning into an error ...
    escalate_after: int = 3
    escalate_window: float = 300.0
    #: ... and seconds without a trip that turn it back.
    calm_after: float = 1800.0

    def __post_init__(self) -> None:
        if self.failures < 1 or self.window <= 0 or self.open_for <= 0 or self.open_max < self.open_for:
            raise ValueError(f"invalid breaker policy: {self}")
        if self.ratio is not None and not 0 < self.ratio <= 1:
            raise ValueError(f"breaker ratio must be in (0, 1], got {self.ratio}")
        if self.growth not in GROWTHS:
            raise ValueError(f"breaker growth must be one of {', '.join(GROWTHS)}, got {self.growth!r}")

    @classmethod
    def of(
        cls, value: BreakerPolicy | Mapping[str, Any] | bool | None, default: BreakerPolicy | None
    ) -> BreakerPolicy | None:
        """A handler's ``breaker=`` option: a policy, a dict of fields over ``default``, True/False, or None
        (the app's ``default``: no breaker unless ``amqp_events_breaker`` configures one)."""
        if value is None:
            return default
        if value is False:
            return None
        if value is True:
            return default or cls()
        if isinstance(value, Mapping):
            base = default or cls()
            return cls(**{**base.__dict__, **value})
        return value

    def open_period(self, consecutive_trips: int) -> float:
        """Seconds a breaker stays open on its ``consecutive_trips``-th trip in a row (1 for the first)."""
        extra = max(0, consecutive_trips - 1)
        if self.growth == "linear":
            period = self.open_for * (1 + extra)
        elif self.growth == "exponential":
            period = self.open_for * 2 ** min(extra, 32)
        else:
            period = self.open_for
        return min(period, self.open_max)


@dataclass(frozen=True)
class Transition:
    """What a breaker just did: the worker pauses on ``OPEN``, resumes on ``HALF_OPEN`` and ``CLOSED``."""

    state: State
    why: str
    #: How loud the transition is logged: an error once trips keep coming (see :class:`BreakerPolicy`).
    level: int = logging.INFO
    open_for: float = 0.0


class Breaker:
    """One handler's breaker in one worker."""

    def __init__(self, policy: BreakerPolicy) -> None:
        self.policy = policy
        self.state = State.CLOSED
        self.outcomes: deque[tuple[float, bool]] = deque()  # (time, failed) within the window
        self.trips: deque[float] = deque()  # times of trips within the escalation window
        self.consecutive_trips = 0
        self.open_until = 0.0
        self.loud_until = 0.0
        #: Why it is held open whatever the outcomes (an operator, a health check): reason -> True.
        self.holds: dict[str, bool] = {}

    def record(self, failed: bool, now: float) -> Transition | None:
        """An outcome of the handler: ``failed`` for an unexpected failure (retried or archived for it)."""
        if self.holds or self.state == State.OPEN:
            return None  # a message that was running when it opened says nothing new
        if self.state == State.HALF_OPEN:
            if failed:
                return self._trip(now, "the half-open probe failed")
            self.state, self.consecutive_trips = State.CLOSED, 0
            self.outcomes.clear()
            return Transition(State.CLOSED, "the half-open probe succeeded")
        self.outcomes.append((now, failed))
        while self.outcomes and self.outcomes[0][0] <= now - self.policy.window:
            self.outcomes.popleft()
        failures = sum(1 for _, bad in self.outcomes if bad)
        if not failed:
            return None
        policy = self.policy
        if policy.ratio is None:
            if failures >= policy.failures:
                return self._trip(now, f"{failures} failures within {policy.window:g}s")
        elif len(self.outcomes) >= policy.min_messages and failures / len(self.outcomes) >= policy.ratio:
            return self._trip(now, f"{failures} of {len(self.outcomes)} runs failed within {policy.window:g}s")
        return None

    def poll(self, now: float) -> Transition | None:
        """Called now and then: an open breaker whose period ended turns half-open."""
        if self.state == State.OPEN and not self.holds and now >= self.open_until:
            self.state = State.HALF_OPEN
            return Transition(State.HALF_OPEN, f"open for {self.policy.open_period(self.consecutive_trips):g}s")
        return None

    def hold(self, reason: str) -> Transition | None:
        """Hold it open for ``reason`` until :meth:`release` (an operator, an unhealthy health check)."""
        self.holds[reason] = True
        if self.state == State.OPEN:
            return None
        self.state = State.OPEN
        return Transition(State.OPEN, f"held open: {reason}", logging.WARNING)

    def release(self, reason: str, now: float) -> Transition | None:
        """End the hold for ``reason``; once none is left, it resumes half-open (or at once, if an operator)."""
        if self.holds.pop(reason, None) is None or self.holds:
            return None
        self.open_until = min(self.open_until, now)
        self.state = State.HALF_OPEN
        return Transition(State.HALF_OPEN, f"released: {reason}")

    def close(self, why: str) -> Transition:
        """Close it without a probe (a breaker that only pauses when told to, released)."""
        self.state, self.consecutive_trips = State.CLOSED, 0
        self.outcomes.clear()
        return Transition(State.CLOSED, why)

    def _trip(self, now: float, why: str) -> Transition:
        policy = self.policy
        self.consecutive_trips += 1
        period = policy.open_period(self.consecutive_trips)
        self.state, self.open_until = State.OPEN, now + period
        self.outcomes.clear()
        self.trips.append(now)
        while self.trips and self.trips[0] <= now - policy.escalate_window:
            self.trips.popleft()
        if len(self.trips) >= policy.escalate_after:
            self.loud_until = now + policy.calm_after
        level = logging.ERROR if now < self.loud_until else logging.WARNING
        return Transition(State.OPEN, why, level, period)
