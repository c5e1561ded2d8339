"""Carrying out an :mod:`~amqp_events.outcome`: publish its copy, then count and log it.

The caller acks the original message only after :func:`settle` returned, so
the copy (a retry, a redelivery, an archived copy) is on the broker, confirmed,
before the original leaves it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from amqp_events import tracing
from amqp_events.logs import log_event
from amqp_events.metrics import HandlerRun, record_archived, record_duplicate
from amqp_events.outcome import Ack, Delivery, Handling, Outcome, Redeliver
from amqp_events.signals import outcome_settled

if TYPE_CHECKING:
    from amqp_events.app import EventsApp


def settle(app: EventsApp, delivery: Delivery, outcome: Outcome, handling: Handling, run: HandlerRun | None) -> None:
    """Publish ``outcome``'s copy (confirmed), record it in ``run``'s metrics, log it and signal it
    (:data:`amqp_events.signals.outcome_settled`).

    ``run`` is ``None`` for messages no handler took (the consumer archives them).
    """
    tracing.settled(outcome)  # before the copy leaves: an archived copy records the attempt's trace context
    if not isinstance(outcome, Ack):
        app.publish_routed(outcome.copy)
    _count_and_log(delivery, outcome, handling, run)
    outcome_settled.send(sender=handling.service, delivery=delivery, outcome=outcome, handling=handling)


def _count_and_log(delivery: Delivery, outcome: Outcome, handling: Handling, run: HandlerRun | None) -> None:
    if isinstance(outcome, Ack):
        if run is not None:
            run.finish(outcome.kind)
        if outcome.duplicate:
            record_duplicate(handling.service, handling.handler)
            _log(delivery, handling, "duplicate skipped", logging.INFO)
        else:  # debug: Celery logs every success at info level already
            _log(delivery, handling, "handled", logging.DEBUG)
        return
    if isinstance(outcome, Redeliver):
        if run is not None:
            run.finish(outcome.kind, outcome.error, "retry")
        what = {"retry": "retrying", "redeliver": "redelivering"}.get(outcome.why, "handed back, breaker open")
        _log(delivery, handling, what, logging.INFO, delay=outcome.delay, error=describe(outcome.error))
        return
    if run is not None:
        run.finish(outcome.kind, outcome.error, "archive")
    record_archived(handling.service, delivery.event, outcome.reason)
    # A message no handler could take is an error of whoever sent it: louder than a handler giving up.
    level = logging.WARNING if handling.handler else logging.ERROR
    _log(delivery, handling, "archived", level, reason=outcome.reason, error=describe(outcome.error))


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}({str(exc)[:200]!r})"


def _log(delivery: Delivery, handling: Handling, what: str, level: int, **fields: object) -> None:
    log_event(
        what,
        event=delivery.event,
        service=handling.service,
        event_id=delivery.event_id,
        attempt=delivery.retries + 1,
        level=level,
        handler=handling.handler or "-",
        **fields,
    )
