"""A message a worker took, in the core's terms: as it arrived (:class:`Received`), as its handler sees it
(:class:`Delivery`), the broker's answer about it (:class:`Answer`, sent by a :class:`Settler`), and the handler
running for it (:class:`Running`, read by :func:`current_event`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from amqp_events.wire.message import EMPTY_EMBED, JSON, LOST_RUNS, EventMetadata, StoredMessage, event_id, event_name


@dataclass(frozen=True)
class Received(StoredMessage):
    """A message as it arrived, before anything decoded it (what ``before_receive`` hooks read): a stored
    message with the exchange and routing key it came through."""

    exchange: str = ""
    routing_key: str = ""


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message as a service's worker received it."""

    headers: Mapping[str, Any]
    #: The service queue it was consumed from: where a retry goes back to.
    queue: str
    exchange: str = ""
    routing_key: str = ""
    args: tuple[Any, ...] | list[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: The body as received, kept byte for byte in the archive (a message that could not be decoded).
    #: ``None``: the body is the task body built from ``args`` and ``kwargs``.
    raw_body: bytes | None = None
    content_type: str | None = JSON
    content_encoding: str | None = "utf-8"

    @property
    def retries(self) -> int:
        """Retries so far (Celery's ``retries`` header): 0 on the first attempt."""
        try:
            return int(self.headers.get("retries") or 0)
        except (TypeError, ValueError):
            return 0

    @property
    def lost_runs(self) -> int:
        """How many times a pool process died running it."""
        try:
            return int(self.headers.get(LOST_RUNS) or 0)
        except (TypeError, ValueError):
            return 0

    @property
    def event(self) -> str:
        return event_name(self.headers)

    @property
    def event_id(self) -> str:
        return event_id(self.headers)

    def task_body(self) -> list[Any]:
        return [list(self.args), dict(self.kwargs), EMPTY_EMBED]


class Answer(Enum):
    """The broker's answer about a message a worker took: AMQP's three, the ack in two kinds. A message gets one."""

    #: Done with it: the broker forgets it.
    ACK = "acked"
    #: Done with it, a confirmed copy having taken its place (a retry, the archive, its events split). This ack
    #: reaches the broker before the next message runs: lost with a process that message kills, it would leave the
    #: message and its copy both about (a lost run would go uncounted, again and again).
    ACK_REPLACED = "acked (replaced)"
    #: Back to its queue as it is, for another delivery (its delivery count goes up).
    REQUEUE = "requeued"
    #: Refused: its queue dead-letters it (back into the queue, counted as a failed attempt).
    REJECT = "rejected"


class Settler(Protocol):
    """How a worker answers the broker about a message it took. Each host sends the answer its own way (from the
    consumer's thread, through a channel in memory); a second answer raises
    :class:`~amqp_events.errors.AlreadySettled`. Which answer an outcome gets is decided in one place:
    :func:`amqp_events.core.outcome.answer_of`."""

    def settle(self, answer: Answer) -> None: ...


@dataclass(frozen=True)
class Running:
    """A handler that runs in this context: what :func:`current_event` and handler sections read (one per
    handler, made once; what is per message comes from ``delivery()``)."""

    #: The message of the run in progress.
    delivery: Callable[[], Delivery]
    service: str
    #: The handler's name (``module.qualname``).
    handler: str
    #: Exceptions the host's runtime steers with (Celery's ``Retry``, ``Ignore``, ``Reject``): never a failure.
    control_flow: tuple[type[BaseException], ...]
    #: Called when an ``optional()`` section swallowed a failure: ``(section name, exception)``.
    optional_failed: Callable[[str, BaseException], None]
    #: Settles a retry of this run now (``self.retry()``): see :func:`amqp_events.core.handling.retry_running`.
    retry: Callable[..., Any]


#: The handler running in this context.
_running: ContextVar[Running | None] = ContextVar("amqp_events_running", default=None)


def running() -> Running | None:
    """The handler running in this context, if one is."""
    return _running.get()


@contextmanager
def handler_running(running: Running) -> Iterator[None]:
    token = _running.set(running)
    try:
        yield
    finally:
        _running.reset(token)


def start_running(running: Running) -> Token[Running | None]:
    """:func:`running` is ``running`` until :func:`stop_running` (the pipeline's hot path: no context manager)."""
    return _running.set(running)


def stop_running(token: Token[Running | None]) -> None:
    _running.reset(token)


def current_event() -> EventMetadata:
    """The event the running handler was called for: id, name, fire time, firing service, attempt.

    >>> @app.handler("billing.invoice.paid")  # doctest: +SKIP
    ... def on_invoice_paid(invoice_id, amount):
    ...     if utcnow() - current_event().fired_at > timedelta(days=1):
    ...         return  # too old to act on
    """
    handler = _running.get()
    if handler is None:
        raise RuntimeError("current_event() is only available while a handler runs in a worker")
    return EventMetadata.from_headers(handler.delivery().headers)
