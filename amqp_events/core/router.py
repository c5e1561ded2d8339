"""The router: what becomes of every message a service's worker takes, decided once, by one function.

Whatever runs the worker (Celery's consumer with any pool, the ordered partitions' consumers, the in-process mode),
each message it takes goes through :func:`route`, which returns one :data:`Route`:

* :class:`ToArchive`: no handler of the service may run it: it goes to the archive as it arrived, with the reason;
* :class:`Copies`: a fired event for several handlers in the queue they share: a copy goes to each, naming it; an
  ordered handler's event that came without its key's slot: a copy goes to its key's partition;
* :class:`Defer`: it came before its ``eta``: it waits the rest on the broker's delay ladder, unrun;
* :class:`ToHandler`: its handler runs it (``batch``: each event of a history replay's batch in turn; an ordered
  handler's message goes to its key's lane).

On the way (in this order, each step once): its headers are checked and bounded (:mod:`amqp_events.wire.bounds`),
the ``before_receive`` hooks read it and what they change is written back into the message, what it says is made
to say only what the service may believe (:mod:`amqp_events.wire.trust`), its body is decoded, and its handler
chosen by the queue it arrived on and the event it was fired as (:mod:`amqp_events.core.addressing`).

The hosts differ only in how messages arrive and how their outcome is settled on the broker (ack, requeue or
reject: :class:`~amqp_events.core.delivery.Settler`). No I/O here: the message is read and changed in place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from amqp_events.core import addressing, handling
from amqp_events.core.addressing import Unroutable
from amqp_events.core.context import ServiceContext
from amqp_events.core.delivery import Delivery, Received
from amqp_events.core.handler import Handler
from amqp_events.errors import BadArguments, Expired, NotOwner, Refused, TooLarge
from amqp_events.topology import delays, ordered_exchange_name
from amqp_events.topology.names import event_of, intake_queue_name, slot_of
from amqp_events.topology.ownership import owner_of_event
from amqp_events.wire import batch, bounds
from amqp_events.wire.archive_headers import ARCHIVE_CUT
from amqp_events.wire.message import (
    EVENT_KEY,
    EVENT_SLOT,
    FIRED_BY,
    X_DELIVERY_COUNT,
    OutgoingMessage,
    Reason,
    event_id,
    event_key,
    event_name,
    isoformat,
    parse_time,
)
from amqp_events.wire.trust import drop_unverified, vouch

logger = logging.getLogger(__name__)


class Incoming(Protocol):
    """A message as a worker took it (kombu's ``Message`` is one): what the router reads, and changes in place."""

    headers: Any
    body: Any
    content_type: str | None
    content_encoding: str | None
    delivery_info: Mapping[str, Any]
    properties: Mapping[str, Any]
    #: What went wrong making it (kombu could not inflate its body): ``(type, error, traceback)`` each.
    errors: list[Any]

    def decode(self) -> Any:
        """Its body, deserialized (and kept: Celery reads it again)."""


@dataclass(frozen=True)
class ToArchive:
    """No handler of the service may run it: it is archived as it arrived, with ``reason`` (``handler``: the one
    chosen for it by the queue and the event, when one was: the archive records it, and a replay goes to it)."""

    reason: Reason
    error: Exception
    handler: Handler | None = None


@dataclass(frozen=True)
class Copies:
    """A fired event that came in for several handlers (in the queue they share): a copy goes to each, naming it."""

    messages: list[OutgoingMessage]


@dataclass(frozen=True)
class Defer:
    """It came before its ``eta``: it waits ``delay`` more seconds on the broker, unrun."""

    delivery: Delivery
    delay: int


@dataclass(frozen=True)
class ToHandler:
    """``handler`` runs it; ``batch``: it is a history replay's batch, whose events run one after another."""

    handler: Handler
    batch: bool = False


Route = ToArchive | Copies | Defer | ToHandler


def route(context: ServiceContext, message: Incoming, arrived_on: str) -> Route:
    """What becomes of ``message``, taken from the queue ``arrived_on`` by a worker of ``context``'s service; a
    message nobody foresaw is archived as undecodable rather than stopping the worker."""
    try:
        return _route(context, message, arrived_on)
    except Exception as exc:
        logger.exception("could not read a message in service %r; archiving it", context.name)
        if isinstance(message.headers, dict):  # its archived copy says only what may be believed
            vouch(context.identity, (message.properties or {}).get("user_id"), message.headers)
        return ToArchive(Reason.UNDECODABLE, exc)


def _route(context: ServiceContext, message: Incoming, arrived_on: str) -> Route:
    if not isinstance(message.headers, dict):
        return ToArchive(Reason.MALFORMED_HEADERS, ValueError("the headers are not a table"))
    headers = message.headers
    headers.pop(ARCHIVE_CUT, None)  # only an archived copy says what was cut, and only a worker writes it
    info = message.delivery_info or {}
    if not info.get("redelivered"):  # the broker counts deliveries on redeliveries alone
        headers.pop(X_DELIVERY_COUNT, None)
    hooks = bool(context.middleware.before_receive) and not batch.is_batch(headers)
    # Both, always: what either finds must go before a copy is made (a copy could carry neither).
    cut = too_large(message, context.settings.max_body_bytes)
    wrong = without_wrong_headers(headers, bounds.malformed(headers, complete=not hooks))
    refused = cut or wrong
    if refused is None and hooks:
        refused = read_in_place(message, lambda received: handling.receive(context, received))
        # What the hooks made of it (a CloudEvent's id); headers they left as they were lack only what an event must
        # have (the rest was checked above).
        after = message.headers
        refused = refused or without_wrong_headers(
            after, bounds.missing(after) if after is headers else bounds.malformed(after)
        )
    drop_unverified(message.headers, info.get("exchange") == context.dead_letter_exchange)
    own = vouch(context.identity, (message.properties or {}).get("user_id"), message.headers)
    if refused is not None:
        return refused
    message.content_type, message.content_encoding = bounds.json_type(message.content_type, message.content_encoding)
    try:
        if message.errors:  # the host could not inflate it when it made the message
            raise message.errors[0][1]
        body = message.decode()
    except Exception as exc:
        return ToArchive(bounds.decoding_reason(exc), exc)
    headers = message.headers
    headers.pop("compression", None)  # the body is inflated now; a copy of it is not compressed
    exchange, routing_key = info.get("exchange") or "", info.get("routing_key") or ""
    chosen = addressing.address(context, headers, arrived_on, exchange, routing_key, own)
    if isinstance(chosen, Unroutable):
        return ToArchive(chosen.reason, chosen.error)
    # The service's own copies too (a retry, a replay): each is judged by the author it records, as it was.
    refused = not_owned(context, headers, chosen if isinstance(chosen, Handler) else None)
    if refused is not None:
        return refused
    if isinstance(chosen, tuple):
        return Copies(addressing.one_for_each(headers, body, chosen))
    if batch.is_batch(headers):
        return batch_of(chosen, headers, body)
    cannot = addressing.runnable(body)
    if cannot is not None:
        return ToArchive(cannot.reason, cannot.error, chosen)
    routed = timing(context, chosen, headers, info, body)
    if isinstance(routed, ToHandler) and chosen.ordered:
        return to_partition(context, routed, message, arrived_on, body)
    return routed


def without_wrong_headers(headers: dict[Any, Any], wrong: dict[Any, str]) -> ToArchive | None:
    """The ``wrong`` headers (not what they must be) removed, the archived copy keeping the others, and why."""
    if not wrong:
        return None
    for name in wrong:
        headers.pop(name, None)
    return ToArchive(Reason.MALFORMED_HEADERS, ValueError(bounds.describe(wrong)))


def too_large(message: Incoming, max_body: int) -> ToArchive | None:
    """Headers a copy could not carry, or a body over ``max_body``: cut in place to what an archived copy can
    carry, and why (also in its ``archive_cut`` header, for ``archive show`` and the console)."""
    cuts = []
    dropped = bounds.cut_headers(message.headers)
    if dropped:
        cuts.append(f"headers over {bounds.MAX_HEADERS_BYTES} bytes: dropped {', '.join(dropped)}")
    body = message.body  # py-amqp gives text when the content encoding names a charset
    if isinstance(body, str) and len(body) * 4 > max_body:  # a character takes four bytes at most
        body = body.encode("utf-8", "surrogatepass")
    cut = bounds.cut_body(body, max_body) if isinstance(body, bytes) and not message.errors else None
    if cut is not None:
        message.body, note = cut
        cuts.append(f"a body over {max_body} bytes: {note}")
    if not cuts:
        return None
    message.headers[ARCHIVE_CUT] = "; ".join(cuts)
    return ToArchive(Reason.TOO_LARGE, TooLarge(f"it came with {message.headers[ARCHIVE_CUT]}"))


def not_owned(context: ServiceContext, headers: dict[str, Any], handler: Handler | None = None) -> ToArchive | None:
    """With ownership on, why a message is refused: its verified author does not own its event."""
    settings = context.settings
    if not settings.event_ownership:
        return None
    event = event_name(headers)
    owner, author = owner_of_event(event, settings.event_owners), headers.get(FIRED_BY) or None
    if author == owner:
        return None
    fired = f"fired by {author!r}" if author else "fired by a user that stands for no service (nothing verified)"
    return ToArchive(
        Reason.NOT_OWNER, NotOwner(f"event {event!r} belongs to {owner!r}, but this one was {fired}"), handler
    )


def batch_of(handler: Handler, headers: Mapping[str, Any], body: Any) -> Route:
    """A history replay's batch for ``handler``: run event by event, or archived whole when it cannot be."""
    try:
        batch.events_of(event_of(str(headers.get("task"))), body)
    except Exception as exc:
        return ToArchive(Reason.UNDECODABLE, exc, handler)
    if handler.ordered:  # a replay sends an ordered handler's events alone, to its partitions
        why = ValueError(f"a replay batch of {handler.task_name!r}, whose handler is ordered")
        return ToArchive(Reason.UNDECODABLE, why, handler)
    return ToHandler(handler, batch=True)


def timing(
    context: ServiceContext, handler: Handler, headers: dict[str, Any], info: Mapping[str, Any], body: Any
) -> Route:
    """Celery's ``expires`` and ``eta``, which the library never sets: an expired message is archived, and one
    that is not due yet waits on the broker's ladder (a worker never holds it); both headers go once it runs."""
    if headers.get("expires") is None and headers.get("eta") is None:
        return ToHandler(handler)
    now = context.now()
    expires, eta = parse_time(headers.pop("expires", None)), parse_time(headers.get("eta"))
    if expires is not None and expires <= now:
        return ToArchive(Reason.EXPIRED, Expired(f"it expired at {isoformat(expires)}"), handler)
    if eta is None or eta <= now:
        headers.pop("eta", None)
        return ToHandler(handler)
    if expires is not None:
        headers["expires"] = isoformat(expires)
    exchange, routing_key = info.get("exchange") or "", info.get("routing_key") or ""
    delay = delays.whole_seconds(min(delays.seconds_until(eta, now), delays.MAX_DELAY))
    return Defer(Delivery(headers, handler.queue, exchange, routing_key, body[0], body[1]), delay)


def to_partition(context: ServiceContext, run: ToHandler, message: Incoming, arrived_on: str, body: Any) -> Route:
    """An ordered handler's event runs in its key's partition, in its key's lane. One that came without its slot
    (from the intake queue: fired without a key, or by a producer that gives only the key) is sent there first,
    keyed by its ``event_key`` header or else by the argument its handler names (its place among that key's events:
    now); one whose arguments give no key is archived."""
    headers = message.headers
    key = headers.get(EVENT_KEY)
    if key is not None and arrived_on != intake_queue_name(context.name):
        return run
    try:
        found = event_key(key if key is not None else run.handler.key_of(tuple(body[0]), dict(body[1])))
    except (BadArguments, ValueError) as exc:
        return ToArchive(Reason.BAD_ARGUMENTS, exc, run.handler)
    slotted = OutgoingMessage(
        ordered_exchange_name(context.name),
        (message.delivery_info or {}).get("routing_key") or "",
        {**headers, EVENT_KEY: found, EVENT_SLOT: slot_of(found)},
        received_of(message).body,  # as it arrived: only its headers change
        event_id(headers),
        message.content_type,
        message.content_encoding,
    )
    return Copies([slotted])


def read_in_place(message: Incoming, read: Callable[[Received], Received]) -> ToArchive | None:
    """Run ``read`` on ``message`` as it arrived and write what it changed back into the message (Celery reads
    its headers and body); returns why it cannot be read instead (the message is then left as it arrived)."""
    received = received_of(message)
    try:
        read_as = read(received)
    except Refused as refused:
        return ToArchive(refused.reason, refused)
    except Exception as exc:  # a hook that cannot read it: archived as what it is, never a stopped consumer
        return ToArchive(Reason.UNDECODABLE, exc)
    if read_as is not received:
        message.headers = dict(read_as.headers)
        message.body = read_as.body
        message.content_type, message.content_encoding = read_as.content_type, read_as.content_encoding
    return None


def received_of(message: Incoming) -> Received:
    """``message`` as it arrived, its body as bytes."""
    info = message.delivery_info or {}
    return Received(
        headers=message.headers if isinstance(message.headers, dict) else {},
        body=message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8"),
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        user_id=(message.properties or {}).get("user_id"),
        exchange=info.get("exchange") or "",
        routing_key=info.get("routing_key") or "",
    )


def archived_delivery(message: Incoming, service: str, queue: str = "") -> Delivery:
    """A message no handler takes, from ``queue`` (when known), kept byte for byte for the archive."""
    received = received_of(message)
    return Delivery(
        headers=received.headers,
        queue=queue or addressing.origin_queue(service, received.exchange, received.routing_key),
        exchange=received.exchange,
        routing_key=received.routing_key,
        raw_body=received.body,
        content_type=received.content_type,
        content_encoding=received.content_encoding,
    )


def decoded_delivery(message: Incoming, queue: str) -> Delivery:
    """The delivery a handler runs for: ``message`` as the router decoded it, from ``queue``."""
    args, kwargs, _ = message.decode()  # decoded once, when it was routed
    info = message.delivery_info or {}
    return Delivery(message.headers, queue, info.get("exchange") or "", info.get("routing_key") or "", args, kwargs)
