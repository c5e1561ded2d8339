"""Exactly-once effects as middleware: a handler's inbox or dedup store (:mod:`amqp_events.inbox`).

* ``inbox=``: the handler's call runs in the inbox's transaction, which records
  the event's key first; a duplicate finds the key and is skipped (acked).
* ``dedup=``: a duplicate whose key the store knows is skipped before the
  handler runs; the key is recorded once the handler succeeded.

Handlers with neither are not touched.
"""

from __future__ import annotations

import logging
from typing import Any

from amqp_events.core.context import Attempt, HandlerCall, Middleware, ServiceContext
from amqp_events.core.handler import Handler
from amqp_events.core.handling import DUPLICATE
from amqp_events.core.outcome import Ack, Outcome
from amqp_events.core.settle import describe
from amqp_events.inbox.base import EffectKey

logger = logging.getLogger(__name__)


def effect_key(attempt: Attempt) -> EffectKey:
    assert attempt.handler is not None
    return EffectKey(attempt.context.name, attempt.handler.name, attempt.delivery.event_id)


class InboxMiddleware(Middleware):
    """Installed by an app when one of its handlers has an inbox or a dedup store."""

    def before_handle(self, attempt: Attempt) -> Outcome | None:
        dedup = attempt.handler.dedup if attempt.handler is not None else None
        if dedup is not None and dedup.seen(effect_key(attempt)):
            return Ack(duplicate=True)
        return None

    def wrap_run(self, context: ServiceContext, handler: Handler, run: HandlerCall) -> HandlerCall:
        inbox = handler.inbox
        if inbox is None:
            return run

        def in_the_inbox(attempt: Attempt, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            with inbox.transaction(effect_key(attempt)) as (handle, first_time):  # the key first: it holds twins back
                return run(attempt, (handle, *args), kwargs) if first_time else DUPLICATE

        return in_the_inbox

    def before_settle(self, attempt: Attempt, outcome: Outcome) -> Outcome:
        dedup = attempt.handler.dedup if attempt.handler is not None else None
        if dedup is not None and isinstance(outcome, Ack) and not outcome.duplicate:
            try:
                dedup.record(effect_key(attempt))
            except Exception as exc:  # the effect happened: running it again would repeat it
                logger.error(
                    "could not record %s as done (%s): a duplicate of it would run again", effect_key(attempt),
                    describe(exc),
                )  # fmt: skip
        return outcome
