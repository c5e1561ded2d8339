"""Retry policy per *section* of a handler: ``retry``, ``optional`` and ``poisonous``.

One exception type can mean different things in different places of a
handler: a ``ConnectionError`` from the payment API is worth ten retries, the
same error from a best-effort notification is not worth failing for, and a
``KeyError`` while reading the payload will never succeed. A section says so
where it happens::

    from amqp_events import optional, poisonous, retry

    @app.handler("billing.invoice.paid")
    def on_invoice_paid(invoice_id: int, amount: str) -> None:
        with poisonous():                      # bad data: archive at once
            cents = parse_amount(amount)
        with retry(max_retries=10, on=(ConnectionError,)):
            payments.capture(invoice_id, cents)
        with optional(ConnectionError):        # a warning, and the handler goes on
            notify_accounting(invoice_id)

A section only marks the exception that leaves it (the innermost section
that matches claims it); :mod:`amqp_events.core.outcome` decides from the mark.
A ``retry`` section's failures are counted in the message
(``section_retries``), apart from the handler's own policy, so its count
survives broker-side retries. A section is named after where it is
(``module.function:line``) unless given ``name=``: give a name when the
count must survive a deploy that moves the line.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from amqp_events.core.delivery import running

#: Named for what it logs: the failures sections claim (also when the handling pipeline logs them).
logger = logging.getLogger("amqp_events.sections")

#: Where a section's mark is kept on the exception it claimed.
MARK = "__amqp_events_section__"


@dataclass(frozen=True)
class Section:
    """A section that claimed a failure: what kind, its name, and a ``retry`` section's own policy."""

    kind: str  # "retry" or "poisonous"
    name: str
    max_retries: int | None = None
    backoff_base: float | None = None
    backoff_max: float | None = None


def section_of(exc: BaseException) -> Section | None:
    """The section that claimed ``exc``, if one did."""
    section = getattr(exc, MARK, None)
    return section if isinstance(section, Section) else None


def _location(depth: int = 2) -> str:
    """``module.function:line`` of the ``with`` statement that made a section."""
    frame = sys._getframe(depth)
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}:{frame.f_lineno}"


def _claimable(exc: BaseException | None, types: tuple[type[BaseException], ...]) -> bool:
    """Is ``exc`` a failure a section of ``types`` claims? Never how the worker's runtime steers a handler
    (Celery's ``self.retry()``, ``Ignore``, ``Reject``), nor one an inner section claimed already."""
    handler = running()
    control_flow = handler.control_flow if handler is not None else ()
    return (
        isinstance(exc, Exception)
        and not isinstance(exc, control_flow)
        and isinstance(exc, types)
        and section_of(exc) is None
    )


class _Marking:
    """A section that marks the failure leaving it and lets it go on (``retry``, ``poisonous``)."""

    def __init__(self, section: Section, on: tuple[type[BaseException], ...]) -> None:
        self.section, self.on = section, on

    def __enter__(self) -> None:
        return None

    async def __aenter__(self) -> None:  # ``async with retry():`` in a coroutine handler, the same section
        return None

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> Literal[False]:
        return self.__exit__(kind, exc, traceback)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> Literal[False]:
        if _claimable(exc, self.on):
            try:
                setattr(exc, MARK, self.section)
            except AttributeError:  # an exception type with __slots__: the handler's own policy applies
                logger.warning("cannot mark %r as failed in section %s", exc, self.section.name)
        return False


def retry(
    max_retries: int | None = None,
    backoff_base: float | None = None,
    backoff_max: float | None = None,
    on: tuple[type[BaseException], ...] = (Exception,),
    name: str | None = None,
) -> _Marking:
    """A failure inside (of the types in ``on``) is retried by this policy, counted apart from the handler's.

    Unset values are the handler's own (``@app.handler(max_retries=...)``, then the app's settings).
    When its retries are used up the message is archived with reason ``max_retries`` and the section.
    """
    section = Section("retry", name or _location(), max_retries, backoff_base, backoff_max)
    return _Marking(section, tuple(on))


def poisonous(name: str | None = None) -> _Marking:
    """A failure inside can never succeed on a retry: the message is archived at once, reason ``poisonous``."""
    return _Marking(Section("poisonous", name or _location()), (Exception,))


class optional:  # lower case: a context manager named as the design document names it
    """A failure inside (of ``exc_types``, or any exception) is logged as a warning and the handler goes on.

    Each one is logged and counted in ``amqp_events_optional_failures_total`` (by the worker's middleware).
    """

    def __init__(self, *exc_types: type[BaseException], name: str | None = None) -> None:
        self.types = exc_types or (Exception,)
        self.name = name or _location()

    def __enter__(self) -> None:
        return None

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> bool:
        return self.__exit__(kind, exc, traceback)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> bool:
        if exc is None or not _claimable(exc, self.types):
            return False
        handler = running()
        if handler is None:  # called outside a worker
            logger.warning("optional section %s failed, going on: %s(%s)", self.name, type(exc).__name__, exc)
        else:
            handler.optional_failed(self.name, exc)
        return True
