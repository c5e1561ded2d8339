"""Exactly-once effects as middleware: a handler's inbox or dedup store (:mod:`amqp_events.inbox`).

* ``inbox=``: the handler's call runs in the inbox's transaction, which records
  the event's key first; a duplicate finds the key and is skipped (acked).
* ``dedup=``: a duplicate whose key the store knows is skipped before the
  handler runs; the key is recorded once the handler succeeded.

Handlers with neither are not touched.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from amqp_events.core.context import Attempt, HandlerCall, Middleware, ServiceContext
from amqp_events.core.handler import Handler
from amqp_events.core.handling import DUPLICATE
from amqp_events.core.options import HandlerOptions
from amqp_events.core.outcome import Ack, Outcome
from amqp_events.core.publishing import describe
from amqp_events.coroutines import is_coroutine_handler
from amqp_events.inbox.base import DedupStore, EffectKey, TransactionalInbox, effect_stores
from amqp_events.settings import Settings

logger = logging.getLogger(__name__)


def effect_key(attempt: Attempt) -> EffectKey:
    assert attempt.handler is not None
    return EffectKey(attempt.context.name, attempt.handler.name, attempt.delivery.event_id)


def _check(handler: Handler, options: Mapping[str, Any]) -> Mapping[str, Any]:
    if options["inbox"] is None:
        return {}
    parameters = list(handler.signature.parameters.values())
    takes = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    if not parameters or parameters[0].kind not in takes:
        raise TypeError(
            f"{handler.name} has an inbox, so it receives the inbox's session or connection as its first "
            "argument: add a parameter for it, e.g. def handler(session, ...)"
        )
    coroutine, async_inbox = is_coroutine_handler(handler.function), getattr(options["inbox"], "is_async", False)
    if coroutine and not async_inbox:
        raise TypeError(
            f"{handler.name} is a coroutine handler: its inbox must hand it an async session, "
            "Inbox(async_sessionmaker(...)) or Inbox(create_async_engine(...)), not one that blocks its event loop"
        )
    if async_inbox and not coroutine:
        raise TypeError(f"{handler.name} has an inbox of async sessions: write it as a coroutine (async def)")
    return {"handle_first": True}


class InboxOptions(TypedDict, total=False):
    """``@app.handler``'s options of exactly-once effects."""

    #: Runs the handler in a transaction that records the event (handed to it as its first argument).
    inbox: TransactionalInbox | None
    #: Skips events already handled (a store such as :class:`amqp_events.inbox.RedisDedup`).
    dedup: DedupStore | None


#: ``inbox=`` and ``dedup=``: the handler options of this middleware.
INBOX_OPTIONS = HandlerOptions("inbox", {"inbox": None, "dedup": None}, _check)


class InboxMiddleware(Middleware):
    """Installed by an app when one of its handlers has an inbox or a dedup store."""

    @classmethod
    def for_service(cls, settings: Settings, handlers: Sequence[Handler], version: str) -> InboxMiddleware | None:
        return cls() if any(any(effect_stores(handler)) for handler in handlers) else None

    def before_handle(self, attempt: Attempt) -> Outcome | None:
        dedup = effect_stores(attempt.handler)[1] if attempt.handler is not None else None
        if dedup is not None and dedup.seen(effect_key(attempt)):
            return Ack(duplicate=True)
        return None

    def wrap_run(self, context: ServiceContext, handler: Handler, run: HandlerCall) -> HandlerCall:
        inbox = effect_stores(handler)[0]
        if inbox is None:
            return run

        def in_the_inbox(attempt: Attempt, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            with inbox.transaction(effect_key(attempt)) as (handle, first_time):  # the key first: it holds twins back
                return run(attempt, (handle, *args), kwargs) if first_time else DUPLICATE

        return in_the_inbox

    def before_settle(self, attempt: Attempt, outcome: Outcome) -> Outcome:
        dedup = effect_stores(attempt.handler)[1] if attempt.handler is not None else None
        if dedup is not None and isinstance(outcome, Ack) and not outcome.duplicate:
            try:
                dedup.record(effect_key(attempt))
            except Exception as exc:  # the effect happened: running it again would repeat it
                logger.error(
                    "could not record %s as done (%s): a duplicate of it would run again", effect_key(attempt),
                    describe(exc),
                )  # fmt: skip
        return outcome
