"""The time a service reads: the system clock, or a test's virtual clock.

Every timestamp a service puts on a message (``fired_at``, ``due_at``,
``first_failure_at``, the archive's times) comes from its own clock
(:attr:`amqp_events.core.context.ServiceContext.clock`). While a handler
runs, :func:`utcnow` reads that service's clock, so that a handler run by the
in-process mode of :mod:`amqp_events.testing` sees the virtual time too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timezone
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


@contextmanager
def reading(clock: Clock) -> Iterator[None]:
    """Inside the block (in this context only), :func:`utcnow` reads ``clock``."""
    token = _running.set(clock)
    try:
        yield
    finally:
        _running.reset(token)
