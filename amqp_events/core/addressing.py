"""Which handler of a service runs a message: decided by the receiver, from what the broker verified (a step of
:func:`amqp_events.core.router.route`).

A worker knows the queue a message arrived on (the broker delivered it from there) and how it was routed (the
exchange, and the routing key a topic permission lets its user publish with). :func:`address` chooses by those:
a handler that takes its events from that queue, of the event the message fires. What the message says itself
is believed only where the service sent it (:mod:`amqp_events.wire.trust`): the handler a copy names
(``for_handler``), the queue it was sent to by name. A sender's ``task`` header cannot pick another handler,
nor another event than the one it was fired as; a sender's Celery embed (callbacks, a chain) is never followed.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from amqp_events.core.context import ServiceContext
from amqp_events.core.handler import Handler
from amqp_events.topology import delays, event_queue_name
from amqp_events.topology.names import event_of, fired_event, is_direct_exchange, task_of_queue, to_queue
from amqp_events.wire.message import (
    FIRED_AS,
    FOR_HANDLER,
    OutgoingMessage,
    Reason,
    copy_headers,
    event_id,
    is_task_body,
)

#: The keys of a body's embed with which Celery would start other tasks.
WORKFLOW = ("callbacks", "errbacks", "chain", "chord")


@dataclass(frozen=True)
class Unroutable:
    """No handler of the service may run the message: it is archived, as it arrived, with ``reason``."""

    reason: Reason
    error: Exception


#: One handler (its ``task`` header now names it), several (a copy goes to each), or none.
Addressed = Handler | tuple[Handler, ...] | Unroutable


def address(
    context: ServiceContext, headers: dict[str, Any], arrived_on: str, exchange: str, routing_key: str, own: bool
) -> Addressed:
    """The handler(s) of ``context``'s service that a message with ``headers``, taken from the queue
    ``arrived_on`` after it was published to ``exchange`` with ``routing_key``, is for. ``own``: the service
    sent it itself (a retry, a replay). The ``task`` header is set to the handler's task name when there is one.
    """
    task = headers.get("task")
    if not isinstance(task, str) or not task:
        return Unroutable(Reason.UNDECODABLE, not_an_event())
    event = event_of(task)
    fired_as = fired_event(exchange, routing_key, context.settings.exchange)
    if fired_as is None and own:  # a replay of a message archived before it reached a handler says how it came
        claimed = headers.get(FIRED_AS)
        fired_as = claimed if isinstance(claimed, str) and claimed else None
    if fired_as is not None and fired_as != event:
        why = f"its 'task' header says {event!r}, but it was fired as {fired_as!r}"
        return Unroutable(Reason.MALFORMED_HEADERS, ValueError(why))
    named = named_by_copy(context, headers, exchange, routing_key) if own else None
    if named is not None and named.event == event:
        headers["task"] = named.task_name
        return named
    takers = tuple(handler for handler in context.takers(arrived_on) if handler.event == event)
    if not takers:
        return Unroutable(Reason.UNKNOWN_EVENT, unknown_event(context.name, event, arrived_on))
    if len(takers) == 1:
        headers["task"] = takers[0].task_name
        return takers[0]
    return takers


def named_by_copy(
    context: ServiceContext, headers: Mapping[str, Any], exchange: str, routing_key: str
) -> Handler | None:
    """The handler a copy of the service's own names: by ``for_handler`` (a copy in a queue several handlers
    share), or by the queue it was sent to by name (a retry or replay of the per-handler layout, perhaps routed
    to another layout's queue since: :mod:`amqp_events.topology.moving`)."""
    wanted = headers.get(FOR_HANDLER)
    if isinstance(wanted, str):
        return context.handlers.get(wanted)
    sent_to = sent_to_queue(exchange, routing_key)
    return context.handlers.get(task_of_queue(context.name, sent_to) or "") if sent_to else None


def runnable(body: Any) -> Unroutable | None:
    """Why a body cannot run as an event, if it cannot: it is not a Celery task body, or its embed asks Celery
    to run other tasks (which only the receiver may decide)."""
    if not is_task_body(body):
        return Unroutable(Reason.UNDECODABLE, ValueError("the body is not a Celery task body [args, kwargs, embed]"))
    embed = body[2] or {}
    asked = sorted(key for key in WORKFLOW if embed.get(key))
    if asked:
        error = ValueError(f"its body's embed asks Celery to run other tasks ({', '.join(asked)}): an event never does")
        return Unroutable(Reason.EMBEDDED_WORKFLOW, error)
    return None


def one_for_each(headers: Mapping[str, Any], body: Any, handlers: tuple[Handler, ...]) -> list[OutgoingMessage]:
    """A copy of a fired event for each of ``handlers``, naming it: each then runs, retries and is archived
    on its own."""
    retries = int(headers.get("retries") or 0)
    return [
        OutgoingMessage(
            *to_queue(handler.queue),
            copy_headers(headers, retries, task=handler.task_name, **{FOR_HANDLER: handler.task_name}),
            body,
            event_id(headers),
        )
        for handler in handlers
    ]


def not_an_event() -> Exception:
    return ValueError("no 'task' header: not an event")


def unknown_event(service: str, name: object, queue: str = "") -> Exception:
    where = f" in queue {queue!r}" if queue else ""
    return LookupError(f"service {service!r} has no handler for event {name!r}{where}")


def sent_to_queue(exchange: str, routing_key: str) -> str:
    """The queue a message was sent to alone, by its name (a retry, a replay), or ""."""
    if is_direct_exchange(exchange):
        return routing_key
    if not (delays.is_delivery_exchange(exchange) or delays.is_ladder_level(exchange)):
        return ""
    try:  # off a delay ladder (through its last level's exchange, or the delivery exchange)
        kind, _, name = delays.decode_routing_key(routing_key)[1].partition(".")
    except ValueError:
        return ""
    return name if kind == "queue" else ""


def origin_queue(service: str, exchange: str, routing_key: str) -> str:
    """The queue of ``service`` a message was consumed from, worked out from how it was routed."""
    try:
        if delays.is_delivery_exchange(exchange):
            _, destination = delays.decode_routing_key(routing_key)
            kind, _, name = destination.partition(".")
            return name if kind == "queue" else event_queue_name(service, name)
        if exchange == "" or is_direct_exchange(exchange):  # sent to that one queue by its name
            return routing_key
        return event_queue_name(service, routing_key)
    except ValueError:  # also InvalidName
        return ""
