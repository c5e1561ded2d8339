"""The time a service reads: the system clock, or a test's virtual clock.

Every timestamp a service puts on a message (``fired_at``, ``due_at``,
``first_failure_at``, the archive's times) comes from its own clock
(:attr:`amqp_events.core.context.ServiceContext.clock`). While a handler
runs, :func:`utcnow` reads that service's clock, so that a handler run by the
in-process mode of :mod:`amqp_events.testing` sees the virtual time too.
"""

from __future__ import annotations

import re
from contextvars import ContextVar, Token
from datetime import datetime, timedelta, timezone
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Now, as an aware UTC datetime."""


class SystemClock:
    """The real time."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)


SYSTEM_CLOCK = SystemClock()

#: The clock of the service whose handler runs in this context.
_running: ContextVar[Clock] = ContextVar("amqp_events_clock", default=SYSTEM_CLOCK)


def utcnow() -> datetime:
    """Now, as an aware UTC datetime: by the clock of the service whose handler is running, else the system's."""
    return _running.get().now()


def start_reading(clock: Clock) -> Token[Clock]:
    """From now on (in this context only), :func:`utcnow` reads ``clock``, until :func:`stop_reading`."""
    return _running.set(clock)


def stop_reading(token: Token[Clock]) -> None:
    _running.reset(token)


_AGO = re.compile(r"^(?P<amount>[0-9]+)(?P<unit>[smhD])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "D": "days"}


def parse_moment(text: str, now: datetime) -> datetime:
    """A time an operator wrote: ISO-8601 (UTC unless it says otherwise), or how long before ``now`` (``90m``,
    ``2h``, ``7D``); ``ValueError`` says what is accepted."""
    text = text.strip()
    ago = _AGO.match(text)
    if ago:
        return now - timedelta(**{_UNITS[ago["unit"]]: int(ago["amount"])})
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither an ISO-8601 time nor a time ago like 90m, 2h or 7D") from None
    return found if found.tzinfo else found.replace(tzinfo=timezone.utc)
