"""The handling pipeline: every message a service's worker takes goes through here, whatever runs the worker.

* :func:`receive`: a message as it arrived, through the ``before_receive``
  hooks (a CloudEvent is read into the library's form); then
  :func:`amqp_events.core.router.route` says what becomes of it.
* :func:`handle`: a handler's run, from the middleware's ``before_handle``
  to its settled outcome (:mod:`amqp_events.core.outcome` decides it,
  :mod:`amqp_events.core.publishing` publishes its copy).
* :func:`retry_running`: the running handler asked to be retried (``self.retry()``).
* :func:`lost`: the pool process running a message died.
* :func:`archive_refused`: a message no handler can take goes to the archive as it arrived.
* :func:`defer`: a message that came before its ``eta`` waits on the broker.

Each ends in the ``after_handle`` hooks, once. The caller (the Celery
adapter, :mod:`amqp_events.celery`) acks the original message once this
returned, and turns the outcome into what its runtime expects.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import replace
from typing import Any

from amqp_events.clock import SYSTEM_CLOCK, start_reading, stop_reading
from amqp_events.core import sections
from amqp_events.core.context import Attempt, HandlerCall, ServiceContext
from amqp_events.core.delivery import Delivery, Received, Running, running, start_running, stop_running
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Ack, CannotRun, Failed, Lost, Outcome, decide, deferred_until_eta, refusal
from amqp_events.core.publishing import describe, publish_outcome
from amqp_events.errors import BadArguments, RetryRequested
from amqp_events.wire.message import Reason

logger = logging.getLogger(__name__)

#: What a run returns when its effect happened already (the inbox knows its key): it is skipped, acked.
DUPLICATE = object()
#: The attempt whose handler runs in this context.
_attempt: ContextVar[Attempt | None] = ContextVar("amqp_events_attempt", default=None)
#: Each handler's call as the middleware wrapped it and what its code sees, made once per context (a context is
#: made again when an app changes: its entry goes with it).
_prepared: weakref.WeakKeyDictionary[ServiceContext, dict[Handler, tuple[HandlerCall, Running]]] = (
    weakref.WeakKeyDictionary()
)


# -- a message as it arrived -------------------------------------------------------------------------------


def receive(context: ServiceContext, received: Received) -> Received:
    """``received`` through the ``before_receive`` hooks; :class:`~amqp_events.errors.Refused` says why not."""
    for before in context.middleware.before_receive:
        received = before(context, received)
    return received


# -- a handler's run ---------------------------------------------------------------------------------------


def handle(
    context: ServiceContext, handler: Handler, delivery: Delivery, call: Callable[..., Any], can_hold: bool = False
) -> tuple[Outcome, Any]:
    """Run ``handler``'s ``call`` for ``delivery`` and settle the outcome; returns it and what the call returned.
    ``can_hold``: the caller can keep the message and run it again later (a :class:`~amqp_events.core.outcome.Hold`,
    not settled).

    Exceptions of ``context.control_flow`` raised by the call pass through, unsettled.
    """
    attempt = Attempt(context, delivery, handler, "run", call, can_hold)
    try:
        outcome: Outcome | None = None
        for before in context.middleware.before_handle:
            outcome = _before(attempt, before)
            if outcome is not None:  # a middleware takes the message off the handler (a breaker, a duplicate)
                break
        result = None
        if outcome is None:
            outcome, result = _run(attempt)
        if outcome is not attempt.concluded:  # self.retry() settled its outcome already
            outcome = publish_outcome(attempt, outcome)
    except BaseException as error:
        _after(attempt, None, error)
        raise
    _after(attempt, outcome, None)
    return outcome, result


def _before(attempt: Attempt, before: Callable[[Attempt], Outcome | None]) -> Outcome | None:
    """A ``before_handle`` hook; one that raises fails the attempt as the handler would have (retried, then
    archived with its error), rather than sending the message round unsettled for ever."""
    try:
        return before(attempt)
    except Exception as exc:
        if isinstance(exc, attempt.context.control_flow):
            raise
        logger.error(
            "middleware %s failed before handling event %s: %s", before, attempt.delivery.event_id, describe(exc)
        )
        context, handler = attempt.context, attempt.handler
        return decide(attempt.delivery, Failed(exc), context.handling(handler), context.now())


def _run(attempt: Attempt) -> tuple[Outcome, Any]:
    context, delivery, handler = attempt.context, attempt.delivery, attempt.handler
    assert handler is not None
    handling = context.handling(handler)
    refused = refusal(delivery, handling)
    if refused is not None:
        return decide(delivery, refused, handling, context.now()), None
    try:
        given = dict(delivery.kwargs) if attempt.arguments is None else attempt.arguments
        args, kwargs = handler.fit(tuple(delivery.args), given)
    except BadArguments as exc:
        return decide(delivery, CannotRun(Reason.BAD_ARGUMENTS, exc), handling, context.now()), None
    prepared = _prepared.get(context)
    if prepared is None:
        prepared = _prepared[context] = {}
    if handler not in prepared:
        prepared[handler] = (_wrapped_run(context, handler), _running_of(context, handler))
    run, running = prepared[handler]
    # Context variables, not context managers: this is the hot path.
    attempt_token, running_token = _attempt.set(attempt), start_running(running)
    clock_token = start_reading(context.clock) if context.clock is not SYSTEM_CLOCK else None
    try:
        result = run(attempt, args, kwargs)
    except BaseException as exc:
        if attempt.concluded is not None:  # self.retry() settled it, then raised to leave the handler
            return attempt.concluded, None
        if isinstance(exc, context.control_flow) or not isinstance(exc, Exception):
            raise
        return decide(delivery, Failed(exc), handling, context.now()), None
    finally:
        if clock_token is not None:
            stop_reading(clock_token)
        stop_running(running_token)
        _attempt.reset(attempt_token)
    if attempt.concluded is not None:  # self.retry(throw=False), then the handler returned
        return attempt.concluded, None
    if result is DUPLICATE:
        return Ack(duplicate=True), None
    return Ack(), result


def _wrapped_run(context: ServiceContext, handler: Handler) -> HandlerCall:
    """``handler``'s call wrapped by the middleware (``wrap_run``, the first outermost), made once."""

    def call(attempt: Attempt, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        assert attempt.call is not None
        return attempt.call(*args, **kwargs)

    run: HandlerCall = call
    for wrap in reversed(context.middleware.wrap_run):
        run = wrap(context, handler, run)
    return run


def _running_of(context: ServiceContext, handler: Handler) -> Running:
    """What ``handler``'s code sees while it runs, made once: the attempt in progress comes from ``_attempt``."""

    def current() -> Attempt:
        attempt = _attempt.get()
        assert attempt is not None, "no run in progress"
        return attempt

    def optional_failed(section: str, error: BaseException) -> None:
        attempt = current()
        sections.logger.warning(
            "optional section %s failed, going on: %s(%s) event_id=%s service=%s handler=%s",
            section, type(error).__name__, str(error)[:200], attempt.delivery.event_id, context.name, handler.name,
        )  # fmt: skip
        for hook in context.middleware.optional_failed:
            hook(attempt, section, error)

    def retry(
        error: BaseException | None, countdown: float | None, max_retries: int | None, args: Any, kwargs: Any
    ) -> Outcome:
        attempt = current()
        delivery = attempt.delivery
        if args is not None or kwargs is not None:
            delivery = replace(
                delivery,
                args=delivery.args if args is None else list(args),
                kwargs=delivery.kwargs if kwargs is None else dict(kwargs),
            )
        failed = Failed(error or RetryRequested("the handler asked to be retried"), countdown, max_retries)
        outcome = decide(delivery, failed, context.handling(handler), context.now())
        attempt.concluded = publish_outcome(attempt, outcome)
        return attempt.concluded

    return Running(lambda: current().delivery, context.name, handler.name, context.control_flow, optional_failed, retry)


def retry_running(
    error: BaseException | None,
    countdown: float | None = None,
    max_retries: int | None = None,
    args: Any = None,
    kwargs: Any = None,
) -> Outcome:
    """The running handler asked to run again (``self.retry(...)``): decide and settle that now.

    ``args``/``kwargs`` replace the event's arguments in the retried copy;
    ``countdown`` and ``max_retries`` apply to this decision only. When no
    retry is left the message is archived instead. The handler then leaves
    (the adapter raises), and :func:`handle` ends with this outcome.
    """
    handler = running()
    if handler is None:
        raise RuntimeError("self.retry() is only available while a handler runs in a worker")
    outcome: Outcome = handler.retry(error, countdown, max_retries, args, kwargs)
    return outcome


# -- a lost process, a message no handler takes -------------------------------------------------------------


def lost(context: ServiceContext, handler: Handler, delivery: Delivery) -> Outcome:
    """The pool process running ``delivery`` died: send it back, or archive it after too many losses.

    Called by the worker's main process, which knows which message its lost
    child was running; it acks the original once this returned.
    """
    attempt = Attempt(context, delivery, handler, "lost")
    return _conclude(attempt, decide(delivery, Lost(), context.handling(handler), context.now()))


def defer(context: ServiceContext, delivery: Delivery, delay: int) -> Outcome:
    """Send ``delivery``, which arrived ``delay`` seconds before its ``eta``, to wait on the broker's ladder."""
    return _conclude(Attempt(context, delivery, None, "refused"), deferred_until_eta(delivery, delay, context.now()))


def archive_refused(
    context: ServiceContext, delivery: Delivery, reason: Reason, error: BaseException, handler: Handler | None = None
) -> Outcome:
    """Archive ``delivery``, which no handler of this service can run, with ``reason`` (``handler``: the one
    chosen for it, which it must not run: the archive records it)."""
    attempt = Attempt(context, delivery, handler, "refused")
    return _conclude(attempt, decide(delivery, CannotRun(reason, error), context.handling(handler), context.now()))


def _conclude(attempt: Attempt, outcome: Outcome) -> Outcome:
    try:
        outcome = publish_outcome(attempt, outcome)
    except BaseException as error:
        _after(attempt, None, error)
        raise
    _after(attempt, outcome, None)
    return outcome


def _after(attempt: Attempt, outcome: Outcome | None, error: BaseException | None) -> None:
    """The ``after_handle`` hooks; one that raises is logged, and the others still run."""
    for after in attempt.context.middleware.after_handle:
        try:
            after(attempt, outcome, error)
        except Exception as exc:
            logger.error(
                "middleware %s failed after handling event %s: %s", after, attempt.delivery.event_id, describe(exc)
            )
