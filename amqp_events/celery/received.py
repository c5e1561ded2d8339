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

import functools
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kombu import compression
from kombu.exceptions import ContentDisallowed
from kombu.message import Message

from amqp_events.core import handling, routing
from amqp_events.core.context import ServiceContext
from amqp_events.core.delivery import Delivery, Received
from amqp_events.core.handler import Handler
from amqp_events.core.routing import Unroutable
from amqp_events.core.settle import describe, publish_routed
from amqp_events.errors import Expired, NotOwner, Refused, TooLarge
from amqp_events.topology import delays
from amqp_events.topology.names import event_of
from amqp_events.topology.ownership import owner_of_event
from amqp_events.wire import batch, limits
from amqp_events.wire.message import (
    ARCHIVE_CUT,
    FIRED_BY,
    X_DELIVERY_COUNT,
    OutgoingMessage,
    Reason,
    event_name,
    isoformat,
    parse_time,
)
from amqp_events.wire.trust import vouch

logger = logging.getLogger(__name__)

#: Seconds between attempts to archive a message the worker cannot run; after the last, it goes back to its queue.
ARCHIVE_RETRY_DELAYS = (1.0, 2.0, 4.0)


def install_limits(max_body: int = limits.MAX_BODY) -> None:
    """Bound what a worker reads before the checks here see a message: kombu's decompression (a zlib bomb
    stops at ``max_body``; compressions without a bound are not read) and, on
    Python 3.11+, whose calls between Python functions take no C stack, the recursion py-amqp needs to read
    the deepest headers a frame can hold (they are then refused as malformed, instead of stopping the
    consumer). Once per worker process."""
    bounded = limits.bounded_decoders(max_body)
    # Upstream (kombu 5.5-5.7): decoders are kept by content type in this table; register() replaces both ways.
    for content_type in list(compression._decoders):
        decoder = bounded.get(content_type) or limits.unsupported(content_type)
        compression._decoders[content_type] = decoder
    if sys.version_info >= (3, 11):
        sys.setrecursionlimit(max(sys.getrecursionlimit(), limits.DECODING_RECURSION))


@dataclass(frozen=True)
class Refusal:
    """A message no handler of the service may run: it is archived, as it arrived, with ``reason``."""

    reason: Reason
    error: Exception


@dataclass(frozen=True)
class Fanout:
    """A fired event that came in for several handlers of the service (in the queue they share): a copy goes
    to each, naming it."""

    copies: list[OutgoingMessage]


@dataclass(frozen=True)
class Early:
    """A message that came before its ``eta``: it waits ``delay`` more seconds on the broker, unrun."""

    delivery: Delivery
    delay: int


Verdict = Refusal | Fanout | Early


def admit(message: Message, context: ServiceContext, queue: str = "") -> Verdict | None:
    """:func:`entering`, and a message that it cannot read (a case nobody foresaw) archived as undecodable."""
    try:
        return entering(message, context, queue)
    except Exception as exc:
        logger.exception("could not read a message in service %r; archiving it", context.name)
        return Refusal(Reason.UNDECODABLE, exc)


def entering(message: Message, context: ServiceContext, queue: str = "") -> Verdict | None:
    """What becomes of ``message`` instead of running, if it must not run now: the one place where a message
    enters a worker. Its headers are checked and bounded before anything reads them
    (:mod:`amqp_events.wire.limits`); the ``before_receive`` hooks run, and what they change is written back
    into the message (a replay batch's events are each read by them as they run:
    :mod:`amqp_events.celery.batches`); what it says is then made to say only what the service may believe
    (:mod:`amqp_events.wire.trust`: its verified author, and no header of the service's own copies unless it
    is one); then its body is decoded, and the handler it is for chosen by :func:`~amqp_events.core.routing.
    route` from ``queue``, the queue it was consumed from."""
    if not isinstance(message.headers, dict):
        return Refusal(Reason.MALFORMED_HEADERS, ValueError("the headers are not a table"))
    message.headers.pop(ARCHIVE_CUT, None)  # only an archived copy says what was cut, and only this worker writes it
    if not (message.delivery_info or {}).get("redelivered"):  # the broker counts deliveries on redeliveries alone
        message.headers.pop(X_DELIVERY_COUNT, None)
    hooks = bool(context.middleware.before_receive) and not batch.is_batch(message.headers)
    # Both, always: what either finds must go before a copy is made (a copy could carry neither).
    cut, wrong = too_large(message, context.settings.max_body_bytes), malformed(message.headers, complete=not hooks)
    refused = cut or wrong
    if refused is None and hooks:
        refused = read_in_place(message, lambda received: handling.receive(context, received))
        refused = refused or malformed(message.headers)  # what the hooks made of it (a CloudEvent's id)
    own = vouch(context.identity, (message.properties or {}).get("user_id"), message.headers)
    if refused is not None:
        return refused
    message.content_type, message.content_encoding = limits.json_type(message.content_type, message.content_encoding)
    try:
        if message.errors:  # kombu could not inflate it when it made the message
            message._reraise_error()
        body = message.decode()  # cached for Celery
    except Exception as exc:
        return decoding_failed(exc)
    message.headers.pop("compression", None)  # the body is inflated now; a copy of it is not compressed
    info = message.delivery_info or {}
    exchange, routing_key = info.get("exchange") or "", info.get("routing_key") or ""
    routed = routing.route(context, message.headers, queue, exchange, routing_key, own)
    if isinstance(routed, Unroutable):
        return Refusal(routed.reason, routed.error)
    refused = None if own else not_owned(context, message.headers)
    if refused is not None:
        return refused
    if isinstance(routed, tuple):
        return Fanout(routing.one_for_each(message.headers, body, routed))
    if batch.is_batch(message.headers):
        return admit_batch(message, routed, body)
    cannot = routing.runnable(body)
    if cannot is not None:
        return Refusal(cannot.reason, cannot.error)
    return timing(message, context, routed, body)


def malformed(headers: dict[Any, Any], complete: bool = True) -> Refusal | None:
    wrong = limits.malformed(headers, complete)
    if not wrong:
        return None
    for name in wrong:  # the archived copy keeps the others; the exception says what these were
        headers.pop(name, None)
    return Refusal(Reason.MALFORMED_HEADERS, ValueError(limits.describe(wrong)))


def too_large(message: Message, max_body: int) -> Refusal | None:
    """Headers a copy could not carry, or a body over ``max_body``: cut in place to what an archived copy can
    carry, and why (also in its ``archive_cut`` header, for ``archive show`` and the console)."""
    cuts = []
    dropped = limits.cut_headers(message.headers)
    if dropped:
        cuts.append(f"headers over {limits.MAX_HEADERS_BYTES} bytes: dropped {', '.join(dropped)}")
    body = message.body  # py-amqp gives text when the content encoding names a charset
    if isinstance(body, str) and len(body) * 4 > max_body:  # a character takes four bytes at most
        body = body.encode("utf-8", "surrogatepass")
    cut = limits.cut_body(body, max_body) if isinstance(body, bytes) and not message.errors else None
    if cut is not None:
        message.body, note = cut
        cuts.append(f"a body over {max_body} bytes: {note}")
    if not cuts:
        return None
    message.headers[ARCHIVE_CUT] = "; ".join(cuts)
    return Refusal(Reason.TOO_LARGE, TooLarge(f"it came with {message.headers[ARCHIVE_CUT]}"))


def not_owned(context: ServiceContext, headers: dict[str, Any]) -> Refusal | None:
    """With ownership on, why a sender's message is refused: its verified author does not own its event."""
    settings = context.settings
    if not settings.event_ownership:
        return None
    event = event_name(headers)
    owner, author = owner_of_event(event, settings.event_owners), headers.get(FIRED_BY) or None
    if author == owner:
        return None
    fired = f"fired by {author!r}" if author else "fired by a user that stands for no service (nothing verified)"
    return Refusal(Reason.NOT_OWNER, NotOwner(f"event {event!r} belongs to {owner!r}, but this one was {fired}"))


def decoding_failed(exc: Exception) -> Refusal:
    """Why a body that cannot be decoded is archived."""
    if isinstance(exc, ContentDisallowed):
        return Refusal(Reason.FORBIDDEN_CONTENT_TYPE, exc)
    if isinstance(exc, TooLarge):
        return Refusal(Reason.TOO_LARGE, exc)
    return Refusal(Reason.UNDECODABLE, exc)


def timing(message: Message, context: ServiceContext, handler: Handler, body: Any) -> Verdict | None:
    """Celery's ``expires`` and ``eta``, which the library never sets: an expired message is archived, and one
    that is not due yet waits on the broker's ladder (a worker never holds it); both headers go once it runs."""
    headers = message.headers
    if headers.get("expires") is None and headers.get("eta") is None:
        return None
    now = context.now()
    expires, eta = parse_time(headers.pop("expires", None)), parse_time(headers.get("eta"))
    if expires is not None and expires <= now:
        return Refusal(Reason.EXPIRED, Expired(f"it expired at {isoformat(expires)}"))
    if eta is None or eta <= now:
        headers.pop("eta", None)
        return None
    if expires is not None:
        headers["expires"] = isoformat(expires)
    info = message.delivery_info or {}
    exchange, routing_key = info.get("exchange") or "", info.get("routing_key") or ""
    queue = handler.queue
    delay = delays.whole_seconds(min(delays.seconds_until(eta, now), delays.MAX_DELAY))
    return Early(Delivery(headers, queue, exchange, routing_key, body[0], body[1]), delay)


def admit_batch(message: Message, handler: Handler, body: Any) -> Refusal | None:
    """Why a worker cannot run the replay batch ``message`` for ``handler``, if it cannot (all of it is
    archived, as it came)."""
    try:
        batch.events_of(event_of(str(message.headers.get("task"))), body)
    except Exception as exc:
        return Refusal(Reason.UNDECODABLE, exc)
    if handler.ordered:  # a replay sends an ordered handler's events alone, to its partitions
        return Refusal(
            Reason.UNDECODABLE, ValueError(f"a replay batch of {handler.task_name!r}, whose handler is ordered")
        )
    return None


def read_in_place(message: Message, read: Callable[[Received], Received]) -> Refusal | None:
    """Run ``read`` on ``message`` as it arrived and write what it changed back into the message (Celery reads
    its headers and body); returns why it cannot be read instead (the message is then left as it arrived)."""
    received = received_of(message)
    try:
        read_as = read(received)
    except Refused as refused:
        return Refusal(refused.reason, refused)
    except Exception as exc:  # a hook that cannot read it: archived as what it is, never a stopped consumer
        return Refusal(Reason.UNDECODABLE, exc)
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


def decoded_delivery(message: Message, queue: str) -> Delivery:
    """The delivery a handler runs for: ``message`` as its consumer decoded it, from ``queue``."""
    args, kwargs, _ = message.decode()  # decoded once, when the consumer admitted it
    info = message.delivery_info
    exchange, routing_key = info.get("exchange") or "", info.get("routing_key") or ""
    return Delivery(message.headers, queue, exchange, routing_key, args, kwargs)


def delivery_of_message(message: Message, service: str, queue: str = "") -> Delivery:
    """A message no handler takes, from ``queue`` (when known), kept byte for byte for the archive."""
    received = received_of(message)
    return Delivery(
        headers=received.headers,
        queue=queue or routing.origin_queue(service, received.exchange, received.routing_key),
        exchange=received.exchange,
        routing_key=received.routing_key,
        raw_body=received.body,
        content_type=received.content_type,
        content_encoding=received.content_encoding,
    )


def _publish_all(copies: list[OutgoingMessage], context: ServiceContext) -> None:
    for copy in copies:
        publish_routed(context, copy)


class Archiver:
    """Archives the messages a worker cannot run, and sends those not due yet to wait on the broker, on the
    consumer's event loop (``timer``)."""

    def __init__(self, context: Callable[[], ServiceContext], timer: Any) -> None:
        self.context, self.timer = context, timer

    def take(self, message: Message, verdict: Verdict) -> None:
        """Carry out ``verdict`` on ``message`` (a copy confirmed on the broker), then ack it."""
        if isinstance(verdict, Refusal):
            self.archive(message, verdict.reason, verdict.error)
        elif isinstance(verdict, Fanout):
            self._settle(message, functools.partial(_publish_all, verdict.copies), 0, "copies, ")
        else:
            self._settle(message, lambda context: handling.postpone(context, verdict.delivery, verdict.delay), 0)

    def archive(self, message: Message, reason: Reason, error: Exception) -> None:
        """Archive ``message`` with ``reason``, then ack it; if that fails, try again later (bounded)."""

        def refuse(context: ServiceContext) -> Any:
            return handling.refuse(context, delivery_of_message(message, context.name), reason, error)

        self._settle(message, refuse, 0, f"{reason}, ")

    def _settle(self, message: Message, publish: Callable[[ServiceContext], Any], attempt: int, why: str = "") -> None:
        context = self.context()
        try:
            publish(context)
        except Exception as exc:
            self._failed(message, publish, attempt, exc, f"a message of service {context.name!r} ({why}id "
                         f"{(message.headers or {}).get('id')!r})")  # fmt: skip
            return
        message.ack()

    def _failed(
        self, message: Message, publish: Callable[[ServiceContext], Any], attempt: int, exc: Exception, about: str
    ) -> None:
        if attempt < len(ARCHIVE_RETRY_DELAYS):
            delay = ARCHIVE_RETRY_DELAYS[attempt]
            logger.warning("could not archive %s: %s; trying again in %gs", about, describe(exc), delay)
            self.timer.call_after(delay, self._settle, (message, publish, attempt + 1))
            return
        logger.error("could not archive %s: %s; returning it to its queue", about, describe(exc))
        try:
            message.reject(requeue=True)
        except Exception:  # the channel is gone: the broker has it back already
            logger.warning("could not return %s to its queue; the broker gets it back with the channel", about)
