"""Flow control in the handling pipeline: before a limited handler runs, its run takes a lease (``concurrency=``)
and a start in each window (``rate_limit=``); after it, the lease goes back.

An event that finds its limit reached is not an attempt: it goes back to the broker unrun, its counters unchanged
(:func:`~amqp_events.core.outcome.wait_over_limit`), to wait about as long as a place takes to free (the spacing of
its rate; a moment for a lease) and come back to its handler's queue. The worker's breakers then stop taking that
queue for as long (:meth:`~amqp_events.breakers.worker.WorkerBreakers.back_off`), so a backlog over its limit waits
in the queue, not going round; a limit per key keeps the queue going for the other keys.

An operator's limits set at run time (``amqp-events limits set``: :mod:`~amqp_events.limits.overrides`) are in
force instead of the code's, in every worker, a moment after they are written.

A start refused by one window may already be counted by a shorter one: a limit is never exceeded, and a handler
at one of its limits may start slightly fewer runs than another allows.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from amqp_events.core.context import Attempt, Middleware
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import CannotRun, Outcome, decide, wait_over_limit
from amqp_events.errors import BadArguments, LimitUnavailable, OverLimit
from amqp_events.limits.operations import in_force
from amqp_events.limits.options import Limits, limits_of
from amqp_events.limits.overrides import Override, decode
from amqp_events.metrics import record_limit_run, record_limit_start, record_limit_wait
from amqp_events.settings import Settings
from amqp_events.topology.limits import lease_names, limit_prefix, limit_settings, window
from amqp_events.wire.message import Reason

logger = logging.getLogger(__name__)

#: Seconds an event waits when every lease of its handler (or key) is held: runs end at any moment.
LEASE_WAIT = 1.0
#: The longest an event over its rate waits at a time before it looks again (and a worker keeps off its handler's
#: queue): the spacing of a long window's rate (``"1/d"``) says nothing of when its oldest start expires.
LONGEST_WAIT = 60
#: Seconds an event waits when its window cannot be reached (its node is down): a node restarts in seconds.
UNAVAILABLE_WAIT = 5.0
#: Where a run keeps its lease between ``before_handle`` and ``after_handle``.
LEASE = "flow_control_lease"


class FlowControl(Middleware):
    """Apply each limited handler's ``concurrency=`` and ``rate_limit=`` across the service's workers."""

    def __init__(self) -> None:
        #: The last table of limits set at run time that was read, and its rows.
        self._table: tuple[bytes | None, dict[str, Override]] = (None, {})
        self.hot_keys = HotKeys()

    @classmethod
    def for_service(cls, settings: Settings, handlers: Sequence[Handler], version: str) -> Middleware | None:
        return cls() if any(limits_of(handler) for handler in handlers) else None

    def before_handle(self, attempt: Attempt) -> Outcome | None:
        handler = attempt.handler
        if handler is None or not limits_of(handler):
            return None
        try:
            return _take(attempt, handler, self.limits_in_force(attempt, handler), self.hot_keys)
        except LimitUnavailable as exc:  # not counted, so not run: it waits as an event over its limit does
            logger.warning("%s: an event of %s waits %ss", exc, handler.name, UNAVAILABLE_WAIT)
            _release(attempt)
            return _wait(attempt, str(exc), UNAVAILABLE_WAIT, False)
        except BadArguments as exc:  # no key in its arguments: it can never run
            context = attempt.context
            cannot = CannotRun(Reason.BAD_ARGUMENTS, exc)
            return decide(attempt.delivery, cannot, context.handling(handler), context.now())

    def after_handle(self, attempt: Attempt, outcome: Outcome | None, error: BaseException | None) -> None:
        _release(attempt)

    def limits_in_force(self, attempt: Attempt, handler: Handler) -> Limits:
        """``handler``'s limits: its code's, or those an operator set at run time."""
        context = attempt.context
        body = context.transport.limit_table(limit_settings(context.name).name)
        if body != self._table[0]:
            try:
                self._table = (body, decode(body) if body is not None else {})
            except ValueError as exc:  # written by hand, or by another version: the table in force stays
                logger.warning("the limits set at run time for %r are not read: %s", context.name, exc)
                self._table = (body, self._table[1])
        return in_force(handler, self._table[1])


def _take(attempt: Attempt, handler: Handler, limits: Limits, hot_keys: HotKeys) -> Outcome | None:
    """Take what a run of ``handler`` needs: ``None`` when it may start, else the outcome of its wait."""
    context, delivery = attempt.context, attempt.delivery
    service = context.name
    args: tuple[Any, ...] = tuple(delivery.args)
    kwargs: dict[str, Any] = dict(delivery.kwargs)
    transport = context.transport
    if limits.concurrency is not None:
        key = limits.concurrency_key(args, kwargs) if limits.concurrency_key else None
        lease = transport.hold(lease_names(limit_prefix(context.name, handler.task_name, key), limits.concurrency))
        if lease is None:
            record_limit_wait(service, handler.name, "concurrency", hot_keys.label(handler.name, key))
            why = f"{limits.concurrency} run(s) of {handler.name} at once{_of(key)}"
            return _wait(attempt, why, LEASE_WAIT, key is not None)
        attempt.state[LEASE] = lease
        record_limit_run(service, handler.name, 1)
    for rate in limits.rates:
        key = limits.rate_key(args, kwargs) if limits.rate_key else None
        prefix = limit_prefix(context.name, handler.task_name, key)
        if not transport.admit(window(prefix, rate.count, rate.seconds, key is not None)):
            _release(attempt)
            record_limit_wait(service, handler.name, "rate", hot_keys.label(handler.name, key))
            return _wait(attempt, f"{rate} runs of {handler.name} started{_of(key)}", rate.spacing, key is not None)
    record_limit_start(service, handler.name)
    return None


class HotKeys:
    """The keys a per-key limit holds back most, by name in the metrics: a key once it has waited ``hot`` times in
    this process, up to ``top`` per handler; the others are ``other``. Bounded: keys come from the events."""

    def __init__(self, top: int = 10, hot: int = 10, tracked: int = 1000) -> None:
        self.top, self.hot, self.tracked = top, hot, tracked
        self._named: dict[str, set[str]] = {}
        self._waits: dict[str, Counter[str]] = {}

    def label(self, handler: str, key: Any) -> str:
        if key is None:
            return ""
        text = repr(key)[:64]
        named = self._named.setdefault(handler, set())
        if text in named:
            return text
        waits = self._waits.setdefault(handler, Counter())
        if len(waits) >= self.tracked:  # the hot ones come back soon enough
            waits.clear()
        waits[text] += 1
        if waits[text] >= self.hot and len(named) < self.top:
            named.add(text)
            return text
        return "other"


def _of(key: Any) -> str:
    return "" if key is None else f" for its key {key!r}"


def _wait(attempt: Attempt, why: str, seconds: float, keyed: bool) -> Outcome:
    seconds = min(LONGEST_WAIT, seconds)
    wait = max(1, math.ceil(seconds))
    logger.debug("event %s waits %ss: its limit (%s) is reached", attempt.delivery.event_id, wait, why)
    error = OverLimit(f"over its limit ({why}): it waits on the broker, unrun", seconds, keyed)
    entry = attempt.context.handling(attempt.handler).delay_entry
    return wait_over_limit(attempt.delivery, attempt.context.now(), wait, error, entry)


def _release(attempt: Attempt) -> None:
    lease = attempt.state.pop(LEASE, None)
    if lease is None:
        return
    if attempt.handler is not None:
        record_limit_run(attempt.context.name, attempt.handler.name, -1)
    try:
        attempt.context.transport.release(lease)
    except Exception as exc:  # its connection failed: the broker gave the lease back with it
        logger.warning("could not give back the lease %s (%s); the broker did when its connection went", lease, exc)
