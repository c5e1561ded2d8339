"""What becomes of a delivered message: the pure outcome core.

Every message a service's worker takes ends in exactly one outcome:

* :class:`Ack`: nothing more to do (the handler returned);
* :class:`Redeliver`: a copy goes back to this service's queue only, after
  a delay on the broker when there is one, with its counters updated;
* :class:`SendToArchive`: a copy goes to the service's archive, with the
  reason and the error.

In the last two cases the original is acked once the broker confirmed the
copy, so a message is never lost between the two. :func:`decide` computes
the outcome from the delivery, what happened and the handler's rules; it
does no I/O (the random source of jitter is an argument). The handling
pipeline (:mod:`amqp_events.core.handling`) carries out what it returns.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from amqp_events.core.delivery import Answer, Delivery
from amqp_events.core.policy import GiveUp, RetryPolicy
from amqp_events.core.sections import Section, section_of
from amqp_events.errors import BreakerOpen, Postponed, Rejected, WorkerLost
from amqp_events.settings import Settings
from amqp_events.topology import delays
from amqp_events.topology.names import to_queue
from amqp_events.wire.archive_headers import ARCHIVE_CUT
from amqp_events.wire.archived import Delivered, Failure, archived_message
from amqp_events.wire.message import (
    FAILED_SECTION,
    FIRST_FAILURE_AT,
    JSON,
    LOST_RUNS,
    SECTION_RETRIES,
    X_DEATH,
    X_DELIVERY_COUNT,
    OutgoingMessage,
    Reason,
    copy_headers,
    delivery_count,
    isoformat,
    json_body,
    parse_time,
    section_retries,
    was_rejected,
)

# -- what happened -------------------------------------------------------------


@dataclass(frozen=True)
class Succeeded:
    """The handler returned."""


@dataclass(frozen=True)
class Failed:
    """The handler raised ``error``, or asked to be retried (``self.retry(countdown=..., max_retries=...)``)."""

    error: BaseException
    countdown: float | None = None
    max_retries: int | None = None


@dataclass(frozen=True)
class Lost:
    """The pool process running the handler died."""


@dataclass(frozen=True)
class CannotRun:
    """The handler must not run, and never will: bad input, an unknown event, too many returns."""

    reason: Reason
    error: BaseException


Happened = Succeeded | Failed | Lost | CannotRun


# -- outcomes ------------------------------------------------------------------
#
# Each outcome has one ``name``, the same in metrics (the ``outcome`` label), traces, logs and the in-process
# mode's records: success, skipped, retry_scheduled, redelivered, handed_back, over_limit, postponed, archived,
# held.


@dataclass(frozen=True)
class Ack:
    """Done: ack the message (``duplicate``: the handler was skipped, its effect had happened already)."""

    duplicate: bool = False

    @property
    def name(self) -> str:
        return "skipped" if self.duplicate else "success"


@dataclass(frozen=True)
class Redeliver:
    """Send ``copy`` back to the service's queue (after ``delay`` seconds), then ack the original."""

    copy: OutgoingMessage
    delay: int
    error: BaseException
    #: ``retry`` after a failure, ``redeliver`` after a lost pool process, ``hand_back_later`` unrun (breaker open),
    #: ``over_limit`` unrun (flow control: its handler's limit is reached),
    #: ``defer`` unrun until its ``eta`` (a delay belongs on the broker, never in a worker).
    why: str = "retry"

    @property
    def name(self) -> str:
        return _REDELIVERY_NAMES[self.why]


@dataclass(frozen=True)
class SendToArchive:
    """Send ``copy`` to the service's archive, then ack the original."""

    copy: OutgoingMessage
    reason: Reason
    error: BaseException
    attempts: int

    name = "archived"


@dataclass(frozen=True)
class Hold:
    """Not settled yet: the worker keeps the message (unacked; its queue gives it no more meanwhile) and runs it
    again in ``seconds``: flow control's wait for a start or a place, in the queue's order, never on the ladder."""

    seconds: float
    error: BaseException

    name = "held"


_REDELIVERY_NAMES = {
    "retry": "retry_scheduled",
    "redeliver": "redelivered",
    "hand_back_later": "handed_back",
    "over_limit": "over_limit",
    "defer": "postponed",
}
Outcome = Ack | Redeliver | SendToArchive | Hold


@dataclass(frozen=True)
class RejectedByHandler:
    """The handler rejected its message itself (Celery's ``Reject``): back to its queue, or dead-lettered."""

    requeue: bool


def answer_of(outcome: Outcome | RejectedByHandler | None) -> Answer:
    """The broker's answer once ``outcome`` is carried out: the one acknowledgement policy of every host.

    ``None``: the host's runtime took the run over (Celery's ``Retry`` sent its copy, or ``Ignore``). A
    :class:`Hold` has no answer yet: the message is run again later."""
    if isinstance(outcome, Ack):
        return Answer.ACK
    if isinstance(outcome, RejectedByHandler):
        return Answer.REQUEUE if outcome.requeue else Answer.REJECT
    if isinstance(outcome, Hold):
        raise ValueError("a held message is answered once it has run")
    return Answer.ACK_REPLACED


@dataclass(frozen=True)
class Handling:
    """Who handles a message and by which rules."""

    service: str
    #: The registered function or class, as ``module.qualname`` ("" when no handler could be found).
    handler: str
    policy: RetryPolicy
    #: Pool processes that may die running one message before it is archived as ``worker_lost``.
    max_deliveries: int
    #: Returns to the queue without an outcome (whole workers dying) before it is archived as ``worker_lost``.
    max_redeliveries: int
    #: The handler's task (its event, and its name beside others of the event): what its archived copies record
    #: as the handler chosen for them ("" when none was).
    task: str = ""
    #: Where the service's own waits (retries, hand-backs) enter a delay ladder: its own, or the shared one.
    delay_entry: str = delays.ENTRY_EXCHANGE

    @classmethod
    def from_settings(cls, settings: Settings, service: str, handler: str = "", **retry_options: Any) -> Handling:
        """The app's rules, with a handler's own retry options (``max_retries``, ``backoff_base``, ...)."""
        return cls(
            service,
            handler,
            RetryPolicy.from_settings(settings, **retry_options),
            settings.max_deliveries,
            settings.max_redeliveries,
        )


def refusal(delivery: Delivery, handling: Handling) -> Failed | CannotRun | None:
    """Why ``delivery`` must not run its handler this time, if it must not.

    A message the broker returned too often without an outcome ends the
    crash loop; a message that came back dead-lettered as rejected counts
    as a failed attempt.
    """
    headers = delivery.headers
    if X_DELIVERY_COUNT not in headers and X_DEATH not in headers:  # the usual case, decided at once
        return None
    returns = delivery_count(headers)
    if returns >= handling.max_redeliveries:
        return CannotRun(Reason.WORKER_LOST, WorkerLost(f"returned to its queue {returns} times without an outcome"))
    if was_rejected(delivery.headers, delivery.queue):
        return Failed(Rejected("the message was rejected without requeue"))
    return None


def decide(
    delivery: Delivery,
    happened: Happened,
    handling: Handling,
    now: datetime,
    rng: Callable[[], float] = random.random,
) -> Outcome:
    """The outcome of ``delivery`` after ``happened``, under ``handling``'s rules (pure: ``rng`` draws jitter)."""
    if isinstance(happened, Succeeded):
        return Ack()
    if isinstance(happened, Failed):
        return after_failure(delivery, happened, handling, now, rng)
    if isinstance(happened, Lost):
        lost = delivery.lost_runs + 1
        error = WorkerLost(f"the process running the handler died ({lost} time(s) so far)")
        if lost >= handling.max_deliveries:
            return archive(delivery, Reason.WORKER_LOST, error, delivery.retries + lost, handling, now)
        headers = {**copy_headers(delivery.headers, delivery.retries), LOST_RUNS: lost}
        return Redeliver(republish(delivery, headers, 0, now), 0, error, why="redeliver")
    # This delivery was an attempt (the log says attempt=N), whether the handler ran or its input was refused.
    return archive(delivery, happened.reason, happened.error, delivery.retries + 1, handling, now)


def after_failure(
    delivery: Delivery, failed: Failed, handling: Handling, now: datetime, rng: Callable[[], float] = random.random
) -> Outcome:
    """A failure's outcome, by the policy of the section it happened in (:mod:`amqp_events.core.sections`).

    A ``retry`` section counts its own retries (``section_retries``); the
    handler's policy counts the retries no section claimed (:mod:`amqp_events.core.sections`).
    """
    section = section_of(failed.error)
    attempts = delivery.retries + 1
    if section is not None and section.kind == "poisonous":
        return archive(delivery, Reason.POISONOUS, failed.error, attempts, handling, now, section.name)
    counts = section_retries(delivery.headers)
    if section is None:
        policy, used = handling.policy, max(0, delivery.retries - sum(counts.values()))
    else:
        policy, used = within(handling.policy, section), counts.get(section.name, 0)
    decision = policy.decide(failed.error, used, countdown=failed.countdown, max_retries=failed.max_retries, rng=rng)
    name = section.name if section is not None else ""
    if isinstance(decision, GiveUp):
        return archive(delivery, decision.reason, failed.error, attempts, handling, now, name)
    first_failure_at = parse_time(delivery.headers.get(FIRST_FAILURE_AT)) or now
    headers = copy_headers(delivery.headers, attempts, **{FIRST_FAILURE_AT: isoformat(first_failure_at)})
    headers.pop(FAILED_SECTION, None)
    if section is not None:
        headers[SECTION_RETRIES] = {**counts, section.name: used + 1}
        headers[FAILED_SECTION] = section.name
    copy = republish(delivery, headers, decision.delay, now, handling.delay_entry)
    return Redeliver(copy, decision.delay, failed.error)


def within(policy: RetryPolicy, section: Section) -> RetryPolicy:
    """``policy`` with a ``retry`` section's own values where it sets them."""
    return replace(
        policy,
        max_retries=policy.max_retries if section.max_retries is None else section.max_retries,
        backoff_base=policy.backoff_base if section.backoff_base is None else section.backoff_base,
        backoff_max=policy.backoff_max if section.backoff_max is None else section.backoff_max,
    )


def hand_back_later(
    delivery: Delivery, now: datetime, wait: int = 0, error: Exception | None = None, entry: str = delays.ENTRY_EXCHANGE
) -> Redeliver:
    """A message taken while its handler's breaker was open (or while its process stops: ``error`` says) goes
    back unrun (after ``wait`` seconds on the broker, in the ladder whose entry is ``entry``), its counters
    unchanged."""
    headers = copy_headers(delivery.headers, delivery.retries)
    if LOST_RUNS in delivery.headers:  # a per-copy count, but this copy is the same delivery again
        headers[LOST_RUNS] = delivery.headers[LOST_RUNS]
    error = error or BreakerOpen("the handler's circuit breaker is open")
    return Redeliver(republish(delivery, headers, wait, now, entry), wait, error, why="hand_back_later")


def wait_over_limit(
    delivery: Delivery, now: datetime, wait: int, error: Exception, entry: str = delays.ENTRY_EXCHANGE
) -> Redeliver:
    """An event over its handler's flow-control limit waits ``wait`` seconds on the broker, unrun, its counters
    unchanged: a wait is not an attempt."""
    return replace(hand_back_later(delivery, now, wait, error, entry), why="over_limit")


def deferred_until_eta(delivery: Delivery, delay: int, now: datetime) -> Redeliver:
    """A message that arrived before its ``eta`` waits on the broker's shared ladder (its sender asked for the
    wait), unrun, its counters unchanged (its ``eta`` kept: one further than the ladder's longest wait is
    postponed again when it comes back)."""
    headers = copy_headers(delivery.headers, delivery.retries)
    error = Postponed(f"its eta is {delay}s away")
    return Redeliver(republish(delivery, headers, delay, now), delay, error, why="defer")


def republish(
    delivery: Delivery, headers: dict[str, Any], delay: int, now: datetime, entry: str = delays.ENTRY_EXCHANGE
) -> OutgoingMessage:
    """A copy of ``delivery`` for its own queue alone, waiting ``delay`` seconds on the broker first (in the
    ladder whose entry is ``entry``)."""
    direct = OutgoingMessage(*to_queue(delivery.queue), headers, delivery.task_body(), delivery.event_id)
    return direct.after(delay, delays.queue_destination(delivery.queue), now, entry)


def archive(
    delivery: Delivery,
    reason: Reason,
    error: BaseException,
    attempts: int,
    handling: Handling,
    now: datetime,
    section: str = "",
) -> SendToArchive:
    """The outcome that sends ``delivery`` to the archive with ``reason`` (failed in ``section``, if any)."""
    failure = Failure.from_exception(
        reason,
        error,
        attempts=attempts,
        first_failure_at=parse_time(delivery.headers.get(FIRST_FAILURE_AT)),
        now=now,
        section=section,
        cut=str(delivery.headers.get(ARCHIVE_CUT) or ""),
    )
    if delivery.raw_body is not None:
        body, content_type, content_encoding = delivery.raw_body, delivery.content_type, delivery.content_encoding
    else:
        body, content_type, content_encoding = json_body(delivery.task_body()), JSON, "utf-8"
    delivered = Delivered(
        headers=copy_headers(delivery.headers, delivery.retries),
        body=body,
        content_type=content_type,
        content_encoding=content_encoding,
        exchange=delivery.exchange,
        routing_key=delivery.routing_key or delivery.event,
        queue=delivery.queue,
    )
    copy = archived_message(delivered, failure, handling.service, handling.handler, handling.task)
    return SendToArchive(copy, reason, error, attempts)
