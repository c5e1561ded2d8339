"""The intake of ordered handlers: a message taken for the ordered runner (:func:`pending_of`); an event that came
without its key's slot is sent on to its partition first."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from amqp_events.core import handling
from amqp_events.core.context import ServiceContext
from amqp_events.core.delivery import Answer, Delivery, Settler
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Outcome, RejectedByHandler
from amqp_events.core.router import decoded_delivery
from amqp_events.core.settle import publish_routed
from amqp_events.errors import BadArguments
from amqp_events.ordering.runner import Pending
from amqp_events.topology import ordered_exchange_name
from amqp_events.topology.names import intake_queue_name, slot_of
from amqp_events.wire.message import EVENT_KEY, EVENT_SLOT, OutgoingMessage, Reason, StoredMessage, event_key

logger = logging.getLogger(__name__)


def key_of(
    context: ServiceContext,
    handler: Handler,
    stored: StoredMessage,
    delivery: Delivery,
    settler: Settler,
) -> str | None:
    """The key of a message of an ordered handler; ``None`` when it was sent on or settled instead.

    An event that came without a slot (from the intake queue: fired without
    a key, or by a producer that gives only the key) is published again with
    its key (the ``event_key`` header, else the argument its handler names)
    and the key's slot, through the ordered exchange to its partition (its
    place among that key's events: now); this copy is acked. One whose
    arguments give no key is archived as ``bad_arguments``.
    """
    key = stored.headers.get(EVENT_KEY)
    if key is not None and delivery.queue != intake_queue_name(context.name):
        return str(key)
    try:
        found = event_key(key if key is not None else handler.key_of(tuple(delivery.args), dict(delivery.kwargs)))
    except (BadArguments, ValueError) as exc:
        handling.dead_letter(context, replace(delivery, raw_body=stored.body), Reason.BAD_ARGUMENTS, exc)
        settler.settle(Answer.ACK_REPLACED)
        return None
    slotted = OutgoingMessage(
        ordered_exchange_name(context.name),
        delivery.routing_key,
        {**stored.headers, EVENT_KEY: found, EVENT_SLOT: slot_of(found)},
        stored.body,
        delivery.event_id,
        stored.content_type,
        stored.content_encoding,
    )
    try:
        publish_routed(context, slotted)
    except Exception:  # it comes back (dead-lettered to the intake queue) and is sent on again
        logger.exception("could not send event %s on to its partition; it comes back", delivery.event_id)
        settler.settle(Answer.REJECT)
        return None
    settler.settle(Answer.ACK_REPLACED)
    return None


def pending_of(
    context: ServiceContext,
    handler: Handler,
    message: Any,
    partition: str,
    settler: Settler,
    run: Callable[[Handler, Delivery, Mapping[str, Any]], Outcome | RejectedByHandler | None],
) -> Pending | None:
    """``message`` of the ordered ``handler`` as the runner holds it (``run``: the host's run of a handler); ``None``
    when it was sent on to its partition or archived instead (:func:`key_of`)."""
    delivery, info = decoded_delivery(message, partition), message.delivery_info
    stored = StoredMessage(message.headers, message.body, message.content_type, message.content_encoding)
    key = key_of(context, handler, stored, delivery, settler)
    if key is None:
        return None
    return Pending(key, handler, delivery, stored, lambda delivery: run(handler, delivery, info), settler)
