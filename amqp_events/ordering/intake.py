"""The intake of ordered handlers: a message taken for the ordered runner (:func:`pending_of`). An event that came
without its key's slot was sent on to its partition by the router (:func:`amqp_events.core.router.to_partition`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from amqp_events.core.delivery import Delivery, Settler
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Outcome, RejectedByHandler
from amqp_events.core.router import decoded_delivery
from amqp_events.ordering.runner import Pending
from amqp_events.wire.message import EVENT_KEY, StoredMessage


def pending_of(
    handler: Handler,
    message: Any,
    partition: str,
    settler: Settler,
    run: Callable[[Handler, Delivery, Mapping[str, Any]], Outcome | RejectedByHandler | None],
) -> Pending:
    """``message`` of the ordered ``handler``, routed to run in its key's partition, as the runner holds it (``run``:
    the host's run of a handler)."""
    delivery, info = decoded_delivery(message, partition), message.delivery_info
    stored = StoredMessage(message.headers, message.body, message.content_type, message.content_encoding)
    key = str(message.headers[EVENT_KEY])
    return Pending(key, handler, delivery, stored, lambda delivery: run(handler, delivery, info), settler)
