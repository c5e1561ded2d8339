"""Messages a worker takes, before Celery runs them: read through the middleware, checked, and archived
as they arrived when no handler of the service can run them.

Upstream (Celery 5.5 to 5.7): the consumer decodes a body later, in code that
crashes the consumer on a body of the wrong shape (a JSON string, say), and
drops or rejects what it cannot run. Here every message is checked first
(:func:`admit`); what cannot run is archived with its reason and acked. If
archiving fails, it is tried again on a short schedule, then the message goes
back to its queue: never dropped, never held for good.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kombu.exceptions import ContentDisallowed
from kombu.message import Message

from amqp_events.core import handling
from amqp_events.core.context import ServiceContext
from amqp_events.core.delivery import Delivery, Received
from amqp_events.core.settle import describe
from amqp_events.errors import Refused
from amqp_events.wire import batch
from amqp_events.wire.message import Reason

logger = logging.getLogger(__name__)

#: Seconds between attempts to archive a message the worker cannot run; after the last, it goes back to its queue.
ARCHIVE_RETRY_DELAYS = (1.0, 2.0, 4.0)


def admit(message: Message, context: ServiceContext) -> tuple[Reason, Exception] | None:
    """Why a worker of ``context``'s service cannot run ``message`` (it is archived with that reason), if it
    cannot. The ``before_receive`` hooks run first, and what they change is written back into the message
    (a replay batch's events are each read by them as they run: :mod:`amqp_events.celery.batches`)."""
    if batch.is_batch(message.headers):
        return admit_batch(message, context)
    if context.middleware.before_receive:
        refused = read_in_place(message, lambda received: handling.receive(context, received))
        if refused is not None:
            return refused.reason, refused
    try:
        body = message.decode()  # cached by kombu for Celery's own decoding
    except ContentDisallowed as exc:
        return Reason.FORBIDDEN_CONTENT_TYPE, exc
    except Exception as exc:
        return Reason.UNDECODABLE, exc
    return handling.runnable(context, message.headers or {}, body)


def admit_batch(message: Message, context: ServiceContext) -> tuple[Reason, Exception] | None:
    """Why a worker cannot run the replay batch ``message``, if it cannot (all of it is archived, as it came)."""
    event = str(message.headers.get("task"))
    try:
        batch.events_of(event, message.decode())
    except ContentDisallowed as exc:
        return Reason.FORBIDDEN_CONTENT_TYPE, exc
    except Exception as exc:
        return Reason.UNDECODABLE, exc
    handler = context.handlers.get(event)
    if handler is None:
        return Reason.UNKNOWN_EVENT, handling.unknown_event(context.name, event)
    if handler.ordered:  # a replay sends an ordered handler's events alone, to its partitions
        return Reason.UNDECODABLE, ValueError(f"a replay batch of {event!r}, whose handler is ordered")
    return None


def read_in_place(message: Message, read: Callable[[Received], Received]) -> Refused | None:
    """Run ``read`` on ``message`` as it arrived and write what it changed back into the message (Celery reads
    its headers and body); returns why it cannot be read instead (the message is then left as it arrived)."""
    received = received_of(message)
    try:
        read_as = read(received)
    except Refused as refused:
        return refused
    if read_as is not received:
        message.headers = dict(read_as.headers)
        message.body = read_as.body
        message.content_type, message.content_encoding = read_as.content_type, read_as.content_encoding
    return None


def received_of(message: Message) -> Received:
    info = message.delivery_info or {}
    return Received(
        headers=message.headers if isinstance(message.headers, dict) else {},
        body=message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8"),
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        exchange=info.get("exchange") or "",
        routing_key=info.get("routing_key") or "",
    )


def delivery_of_message(message: Message, service: str) -> Delivery:
    """A message no handler takes, kept byte for byte for the archive."""
    received = received_of(message)
    return Delivery(
        headers=received.headers,
        queue=handling.origin_queue(service, received.exchange, received.routing_key),
        exchange=received.exchange,
        routing_key=received.routing_key,
        raw_body=received.body,
        content_type=received.content_type,
        content_encoding=received.content_encoding,
    )


class Archiver:
    """Archives the messages a worker cannot run, on the consumer's event loop (``timer``)."""

    def __init__(self, context: Callable[[], ServiceContext], timer: Any) -> None:
        self.context, self.timer = context, timer

    def archive(self, message: Message, reason: Reason, error: Exception, attempt: int = 0) -> None:
        """Archive ``message`` with ``reason``, then ack it; if that fails, try again later (bounded)."""
        context = self.context()
        try:
            handling.refuse(context, delivery_of_message(message, context.name), reason, error)
        except Exception as exc:
            self._failed(message, reason, error, attempt, exc, context.name)
            return
        message.ack()

    def _failed(
        self, message: Message, reason: Reason, error: Exception, attempt: int, exc: Exception, service: str
    ) -> None:
        about = f"a message service {service!r} cannot run ({reason}, id {(message.headers or {}).get('id')!r})"
        if attempt < len(ARCHIVE_RETRY_DELAYS):
            delay = ARCHIVE_RETRY_DELAYS[attempt]
            logger.warning("could not archive %s: %s; trying again in %gs", about, describe(exc), delay)
            self.timer.call_after(delay, self.archive, (message, reason, error, attempt + 1))
            return
        logger.error("could not archive %s: %s; returning it to its queue", about, describe(exc))
        try:
            message.reject(requeue=True)
        except Exception:  # the channel is gone: the broker has it back already
            logger.warning("could not return %s to its queue; the broker gets it back with the channel", about)
