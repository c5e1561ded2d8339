"""Carrying out an :mod:`~amqp_events.core.outcome`: publish its copy, confirmed, before the original goes.

The worker acks the original message only after :func:`publish_outcome` returned, so
the copy (a retry, a redelivery, an archived copy) is on the broker before
the original leaves it: a message is never lost between the two.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from amqp_events.core.context import Attempt, ServiceContext
from amqp_events.core.outcome import Ack, Hold, Outcome, Redeliver, SendToArchive, archive
from amqp_events.errors import PublishRefused, TopologyMissing
from amqp_events.wire.message import EVENT_KEY, OutgoingMessage, Reason
from amqp_events.wire.parked import PARKS_KEY

logger = logging.getLogger(__name__)


def publish_outcome(attempt: Attempt, outcome: Outcome) -> Outcome:
    """Let the middleware see ``outcome`` (``before_settle``), then publish its copy; returns the outcome
    carried out.

    An ordered handler's retry is not published: the worker keeps the original
    (unacked, on the broker) and runs the copy after its delay, so that later
    events of its key wait behind it (:mod:`amqp_events.ordering`).
    """
    for before in attempt.context.middleware.before_settle:
        outcome = before(attempt, outcome)
    if isinstance(outcome, SendToArchive) and attempt.handler is not None and attempt.handler.parks:
        outcome = parking_head(attempt, outcome)
    if isinstance(outcome, Ack | Hold) or (isinstance(outcome, Redeliver) and is_ordered(attempt)):
        return outcome
    try:
        publish_routed(attempt.context, outcome.copy)
    except PublishRefused as refused:
        if not (isinstance(outcome, Redeliver) and outcome.copy.delayed):
            raise
        # A ladder level over its bound: sent round again, the message would loop for as long as it stays full.
        outcome = wait_refused(attempt, outcome, refused)
        logger.warning("event %s: the delay ladder refused its wait; archiving it", attempt.delivery.event_id)
        publish_routed(attempt.context, outcome.copy)
    return outcome


def wait_refused(attempt: Attempt, outcome: Redeliver, refused: PublishRefused) -> SendToArchive:
    """``outcome``'s wait, refused by the broker: the message is archived instead (``delay_refused``)."""
    delivery, context = attempt.delivery, attempt.context
    attempts = delivery.retries + (1 if outcome.why == "retry" else 0)
    return archive(delivery, Reason.DELAY_REFUSED, refused, attempts, context.handling(attempt.handler), context.now())


def is_ordered(attempt: Attempt) -> bool:
    return attempt.handler is not None and attempt.handler.ordered


def parking_head(attempt: Attempt, outcome: SendToArchive) -> SendToArchive:
    """``outcome`` with its archived copy marked as the head of its key's parked events."""
    key = attempt.delivery.headers.get(EVENT_KEY)
    if key is None:  # not run with a key (refused before): nothing waits behind it
        return outcome
    return replace(outcome, copy=replace(outcome.copy, headers={**outcome.copy.headers, PARKS_KEY: key}))


def publish_routed(context: ServiceContext, message: OutgoingMessage) -> None:
    """Publish a message that must reach a queue of ours (a retry copy, an archived copy).

    If nothing received it, a queue or exchange was deleted under us:
    declare the topology again and publish once more.
    """
    transport = context.transport
    if transport.publish(message):
        return
    logger.warning(
        "no queue received %r on exchange %r: declaring the topology again", message.routing_key, message.exchange
    )
    transport.declare(context.topology)
    if not transport.publish(message):
        raise TopologyMissing(
            f"no queue receives {message.routing_key!r} on exchange {message.exchange!r}, "
            "even after declaring the topology again"
        )


def describe(exc: BaseException) -> str:
    """An exception in one short line, for logs."""
    return f"{type(exc).__name__}({str(exc)[:200]!r})"
