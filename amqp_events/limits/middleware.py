"""Flow control in the handling pipeline: before a limited handler runs, its run takes a lease (``concurrency=``)
and a start in each window (``rate_limit=``); after it, the lease goes back.

An event that finds its limit reached is not an attempt (never retried, archived or counted as a failure for
waiting). Where the worker can keep it (every pool but prefork's Celery path), it is held: unacked, in the worker
that took it, whose queue gives it no more of that handler meanwhile, and tried again when a start or a place is
likely free (exactly when this process's own last start stops being counted, else every tenth of a spacing, or
every :data:`LEASE_WAIT`): the backlog stays in its queue, in order (:mod:`amqp_events.limits.waiting`). Otherwise,
or once held too long, it goes back to the broker unrun through the service's own delay ladder, its counters
unchanged (:func:`~amqp_events.core.outcome.wait_over_limit`).

The shortest rate is counted paced (a second's worth of starts at once, or ``burst``: :mod:`~amqp_events.limits.
rates`). A key is counted in its canonical form (:func:`~amqp_events.limits.options.limit_key`), its leases and
windows shared by the keys of its bucket (``amqp_events_limit_keys``).

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
from amqp_events.core.outcome import CannotRun, Hold, Outcome, decide, wait_over_limit
from amqp_events.errors import BadArguments, LimitUnavailable, OverLimit
from amqp_events.limits.operations import in_force
from amqp_events.limits.options import Limits, limit_key, limits_of
from amqp_events.limits.overrides import Override, decode
from amqp_events.limits.waiting import KEYED_HOLD_SPACING, LONGEST_ASK, Waiting
from amqp_events.metrics import record_limit_run, record_limit_start, record_limit_wait
from amqp_events.settings import Settings
from amqp_events.topology.limits import bucket_of, lease_names, limit_prefix, limit_settings, window
from amqp_events.wire.message import Reason

logger = logging.getLogger(__name__)

#: Seconds an event waits when every lease of its handler (or key) is held: runs end at any moment.
LEASE_WAIT = 0.5
#: Seconds an event waits behind one held before it (in this process, or another of the worker) before it looks
#: again: a look costs no broker round trip.
BEHIND_WAIT = 0.05
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
        self.waiting = Waiting()

    @classmethod
    def for_service(cls, settings: Settings, handlers: Sequence[Handler], version: str) -> Middleware | None:
        return cls() if any(limits_of(handler) for handler in handlers) else None

    def before_handle(self, attempt: Attempt) -> Outcome | None:
        handler = attempt.handler
        if handler is None or not limits_of(handler):
            return None
        limits = self.limits_in_force(attempt, handler)
        try:
            return Take(attempt, handler, limits, self).outcome()
        except BadArguments as exc:  # no key in its arguments, or one of no canonical form: it can never run
            context = attempt.context
            cannot = CannotRun(Reason.BAD_ARGUMENTS, exc)
            return decide(attempt.delivery, cannot, context.handling(handler), context.now())

    def after_handle(self, attempt: Attempt, outcome: Outcome | None, error: BaseException | None) -> None:
        _release(attempt)
        if attempt.handler is not None and not isinstance(outcome, Hold):  # settled, by whichever step: not waiting
            self.waiting.leave(attempt.handler.task_name, event_of(attempt))

    def limits_in_force(self, attempt: Attempt, handler: Handler) -> Limits:
        """``handler``'s limits: its code's, or those an operator set at run time."""
        context = attempt.context
        try:
            body = context.transport.limit_table(limit_settings(context.name).name)
        except LimitUnavailable as exc:  # the stream's node is down, or the connection lost: the table in force stays
            logger.warning("the limits set at run time for %r cannot be read now: %s", context.name, exc)
            return in_force(handler, self._table[1])
        if body != self._table[0]:
            try:
                self._table = (body, decode(body) if body is not None else {})
            except ValueError as exc:  # written by hand, or by another version: the table in force stays
                logger.warning("the limits set at run time for %r are not read: %s", context.name, exc)
                self._table = (body, self._table[1])
        return in_force(handler, self._table[1])


class Take:
    """Taking what one run of a limited handler needs, or the outcome of its wait."""

    def __init__(self, attempt: Attempt, handler: Handler, limits: Limits, control: FlowControl) -> None:
        self.attempt, self.handler, self.limits, self.control = attempt, handler, limits, control
        delivery = attempt.delivery
        self.args: tuple[Any, ...] = tuple(delivery.args)
        self.kwargs: dict[str, Any] = dict(delivery.kwargs)
        buckets = attempt.context.settings.limit_keys
        self.concurrency_key = self._key(limits.concurrency_key)
        self.rate_key = self._key(limits.rate_key)
        self.keyed = self.concurrency_key is not None or self.rate_key is not None
        self.line = str(bucket_of(f"{self.concurrency_key}|{self.rate_key}", buckets)) if self.keyed else ""
        self.event = event_of(attempt)

    def _key(self, key: Any) -> str | None:
        return None if key is None else limit_key(key(self.args, self.kwargs))

    def outcome(self) -> Outcome | None:
        """``None`` when the run may start (what it took is noted on the attempt), else how it waits."""
        waiting, task, now = self.control.waiting, self.handler.task_name, self.attempt.context.now().timestamp()
        if self.attempt.can_hold and not waiting.arrive(task, self.line, self.event, now):  # behind an earlier one
            return self.wait("an earlier event waits", BEHIND_WAIT, now)
        try:
            refused = self.take(now)
        except LimitUnavailable as exc:  # not counted, so not run: it waits as an event over its limit does
            logger.warning("%s: an event of %s waits %ss", exc, self.handler.name, UNAVAILABLE_WAIT)
            _release(self.attempt)
            return self.wait(str(exc), UNAVAILABLE_WAIT, now)
        if refused is None:
            waiting.leave(task, self.event)
            record_limit_start(self.attempt.context.name, self.handler.name)
            return None
        why, seconds, spacing = refused
        return self.wait(why, seconds, now, spacing)

    def take(self, now: float) -> tuple[str, float, float] | None:
        """Take a lease and a start in each window: ``None`` when all were taken, else why not, how long a place
        takes to free, and the spacing of the window that refused (0: a lease)."""
        context, limits, handler = self.attempt.context, self.limits, self.handler
        transport, service, buckets = context.transport, context.name, context.settings.limit_keys
        hot_keys = self.control.hot_keys
        if limits.concurrency is not None:
            prefix = limit_prefix(service, handler.task_name, self.concurrency_key, buckets)
            lease = transport.hold(lease_names(prefix, limits.concurrency))
            if lease is None:
                record_limit_wait(
                    service, handler.name, "concurrency", hot_keys.label(handler.name, self.concurrency_key)
                )
                why = f"{limits.concurrency} run(s) of {handler.name} at once{_of(self.concurrency_key)}"
                return why, LEASE_WAIT, 0
            self.attempt.state[LEASE] = lease
            record_limit_run(service, handler.name, 1)
        prefix = limit_prefix(service, handler.task_name, self.rate_key, buckets)
        for number, allowance in enumerate(limits.windows):
            counted = window(prefix, allowance.count, allowance.millis, self.rate_key is not None, allowance.paced)
            told = handler.task_name if number == 0 and self.rate_key is None else ""  # the worker's other processes
            if not transport.admit(counted):
                _release(self.attempt)
                record_limit_wait(service, handler.name, "rate", hot_keys.label(handler.name, self.rate_key))
                wait = self.control.waiting.until_free(counted.queue.name, allowance.spacing, now, told)
                why = f"{allowance.count} run(s) of {handler.name} started in {allowance.millis / 1000:g}s"
                return why + _of(self.rate_key), wait, allowance.spacing
            self.control.waiting.started(counted.queue.name, counted.lasts, now, told)
        return None

    def wait(self, why: str, seconds: float, now: float, spacing: float = 0) -> Outcome:
        """Held here when the worker can (:mod:`~amqp_events.limits.waiting`), else on the service's own ladder."""
        attempt, waiting, task = self.attempt, self.control.waiting, self.handler.task_name
        soon = not self.keyed or spacing < KEYED_HOLD_SPACING
        if attempt.can_hold and soon and waiting.may_hold(task, self.line, self.event, now):
            seconds = waiting.hold(task, self.line, self.event, now, min(LONGEST_ASK, seconds))
            return Hold(seconds, OverLimit(f"over its limit ({why}): held, in its turn", seconds, self.keyed))
        waiting.leave(task, self.event)
        return _wait(attempt, why, seconds, self.keyed)


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


def event_of(attempt: Attempt) -> str:
    """One attempt's event, as it waits in a line (a retry or a lost run's copy is another)."""
    delivery = attempt.delivery
    return f"{delivery.event_id}|{delivery.retries}|{delivery.lost_runs}"


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
