"""The time the library reads: the system clock, or a test's virtual clock.

Every timestamp the library puts on a message (``fired_at``, ``due_at``,
``first_failure_at``, the archive's times) comes from :func:`utcnow`. The
in-process mode of :mod:`amqp_events.testing` swaps in its virtual clock
(:func:`use`) so that those times agree with the delays it simulates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

_source: Callable[[], datetime] | None = None


def utcnow() -> datetime:
    """Now, as an aware UTC datetime."""
    return _source() if _source is not None else datetime.now(timezone.utc)


@contextmanager
def use(source: Callable[[], datetime]) -> Iterator[None]:
    """Read the time from ``source`` inside the block (in every thread)."""
    global _source
    previous, _source = _source, source
    try:
        yield
    finally:
        _source = previous
