"""Replay batches in a worker (:mod:`amqp_events.wire.batch`): each event run through the pipeline, one after
another, as if it had come alone; the batch acked once they all settled.

Each event is first read by the ``before_receive`` hooks, as a message that
came alone would be; one they change or refuse is sent back to the
handler's queue by itself, to be read again (and archived with its reason,
if refused) as an ordinary message. Where a message goes Celery's own way
(the prefork pool, task signals, and so on: :mod:`amqp_events.celery.running`),
a batch is *split* instead: all its events are sent back one by one
(confirmed), then the batch is acked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from amqp_events.core import handling
from amqp_events.core.context import ServiceContext
from amqp_events.core.delivery import Answer, Delivery, Received, Settler
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Outcome, RejectedByHandler
from amqp_events.errors import PublishError, Refused, TopologyMissing
from amqp_events.topology.names import to_queue
from amqp_events.wire.batch import BatchedEvent, events_of
from amqp_events.wire.message import EMPTY_EMBED, JSON, OutgoingMessage, event_name, json_body

logger = logging.getLogger(__name__)

#: The host's run of a handler on one delivery (:meth:`amqp_events.dispatch.runtime.Runtime.run`).
RunHandler = Callable[[Handler, Delivery, Mapping[str, Any]], Outcome | RejectedByHandler | None]


def run_batch(context: ServiceContext, handler: Handler, message: Any, settler: Settler, run: RunHandler) -> None:
    """Run the events of a batch of ``handler``'s (each with ``run``, the host's), then ack it (or reject it, when
    settling failed: it comes back, and an inbox skips what ran)."""
    info = message.delivery_info
    alone = []
    try:
        for event in events_of(handler.event, message.decode()):
            if not receive_hooks_pass_unchanged(context, handler.queue, event):
                alone.append(event)
                continue
            delivery = Delivery(event.headers, handler.queue, "", handler.queue, event.args, event.kwargs)
            if isinstance(run(handler, delivery, info), RejectedByHandler):  # it gets one to reject, alone
                alone.append(event)
        republish_each(context, handler.queue, alone)
    except Exception:
        logger.exception(
            "could not settle replay batch %s of %s; it comes back", message.headers.get("id"), handler.name
        )
        settler.settle(Answer.REJECT)
        return
    settler.settle(Answer.ACK_REPLACED)  # its events' retries (and those sent alone) are copies of it


def receive_hooks_pass_unchanged(context: ServiceContext, queue: str, event: BatchedEvent) -> bool:
    """Do the service's ``before_receive`` hooks read ``event`` as it is (nothing to change, nothing refused)?"""
    if not context.middleware.before_receive:
        return True
    body = json_body([event.args, event.kwargs, EMPTY_EMBED])
    received = Received(event.headers, body, JSON, "utf-8", "", queue)
    try:
        return handling.receive(context, received) is received
    except Refused:
        return False


def split(context: ServiceContext, queue: str, message: Any, settler: Settler) -> None:
    """Send the events of the batch ``message`` to ``queue`` one by one, then ack it."""
    try:
        republish_each(context, queue, events_of(event_name(message.headers), message.decode()))
    except Exception:
        logger.exception("could not split replay batch %s; it comes back", message.headers.get("id"))
        settler.settle(Answer.REJECT)
        return
    settler.settle(Answer.ACK_REPLACED)


def republish_each(context: ServiceContext, queue: str, events: list[BatchedEvent]) -> None:
    """Publish each of ``events`` to ``queue`` as a message of its own, and wait for the broker's confirms."""
    if not events:
        return
    publisher = context.transport.batch(len(events))
    try:
        for event in events:
            body = [event.args, event.kwargs, EMPTY_EMBED]
            publisher.publish(OutgoingMessage(*to_queue(queue), dict(event.headers), body, event.id))
        publisher.wait()
        _, refused, returned = publisher.results()
    finally:
        publisher.close()
    if refused:
        raise PublishError(f"the broker refused {len(refused)} event(s) of a replay batch (nack)")
    if returned:
        raise TopologyMissing(f"the queue {queue!r} is gone: {len(returned)} event(s) of a replay batch went nowhere")
