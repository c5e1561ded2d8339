"""The pure outcome core: every way a delivered message can end, without a broker."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from amqp_events import PermanentFailure, Reason
from amqp_events.core.outcome import (
    Ack,
    CannotRun,
    Delivery,
    Failed,
    Handling,
    Lost,
    Redeliver,
    Succeeded,
    decide,
    refusal,
)
from amqp_events.core.outcome import SendToArchive as Archive
from amqp_events.core.policy import RetryPolicy
from amqp_events.errors import Rejected, WorkerLost
from amqp_events.topology import delays
from amqp_events.wire.archive_headers import ARCHIVE_HEADERS
from amqp_events.wire.message import DUE_AT, EMPTY_EMBED, FIRST_FAILURE_AT, LOST_RUNS, isoformat

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=timezone.utc)
QUEUE = "orders:billing.invoice.paid"


def delivery(retries: int = 0, **headers: object) -> Delivery:
    return Delivery(
        headers={"task": "billing.invoice.paid", "id": "e-1", "retries": retries, "fired_by": "billing", **headers},
        queue=QUEUE,
        exchange="events",
        routing_key="billing.invoice.paid",
        args=[42],
        kwargs={"amount": "10.00"},
    )


def handling(max_retries: int = 3, **options: object) -> Handling:
    policy = RetryPolicy(max_retries=max_retries, **options)  # type: ignore[arg-type]
    return Handling("orders", "orders.handlers.on_paid", policy, max_deliveries=3, max_redeliveries=10)


def test_success_is_an_ack():
    assert decide(delivery(), Succeeded(), handling(), NOW) == Ack()


@pytest.mark.parametrize(("retries", "delay"), [(0, 1), (1, 2), (2, 4)])
def test_a_failure_with_retries_left_goes_back_to_its_own_queue_after_the_backoff(retries, delay):
    outcome = decide(delivery(retries), Failed(ValueError("db down")), handling(), NOW)
    assert isinstance(outcome, Redeliver) and outcome.delay == delay and outcome.why == "retry"
    copy = outcome.copy
    assert copy.exchange == delays.ENTRY_EXCHANGE and copy.delayed
    assert delays.decode_routing_key(copy.routing_key) == (delay, f"queue.{QUEUE}")  # this queue only
    assert copy.headers["retries"] == retries + 1 and copy.message_id == "e-1"
    assert copy.headers[DUE_AT] == isoformat(NOW + timedelta(seconds=delay))
    assert copy.headers[FIRST_FAILURE_AT] == isoformat(NOW)
    assert copy.body == [[42], {"amount": "10.00"}, EMPTY_EMBED]


def test_the_first_failure_time_is_kept_across_retries():
    first = isoformat(NOW - timedelta(hours=1))
    outcome = decide(delivery(2, **{FIRST_FAILURE_AT: first}), Failed(ValueError()), handling(), NOW)
    assert isinstance(outcome, Redeliver) and outcome.copy.headers[FIRST_FAILURE_AT] == first


def test_the_last_retry_is_archived_with_every_attempt_counted():
    outcome = decide(delivery(3), Failed(ValueError("still down")), handling(max_retries=3), NOW)
    assert isinstance(outcome, Archive) and outcome.reason == Reason.MAX_RETRIES and outcome.attempts == 4
    headers = outcome.copy.headers
    assert outcome.copy.routing_key == "orders.archive" and outcome.copy.exchange == "orders.direct"
    assert headers["archive_reason"] == "max_retries" and headers["archive_attempts"] == 4
    assert headers["archive_exception_type"] == "builtins.ValueError"
    assert headers["archive_exception_message"] == "still down"
    assert headers["archive_queue"] == QUEUE and headers["archive_handler"] == "orders.handlers.on_paid"
    assert headers["archived_at"] == isoformat(NOW)
    assert json.loads(outcome.copy.body) == [[42], {"amount": "10.00"}, EMPTY_EMBED]


@pytest.mark.parametrize("error", [PermanentFailure("never"), KeyError("gone")])
def test_non_retryable_errors_are_archived_at_once(error):
    outcome = decide(delivery(), Failed(error), handling(dont_retry=(KeyError,)), NOW)
    assert isinstance(outcome, Archive) and outcome.reason == Reason.NON_RETRYABLE and outcome.attempts == 1


def test_a_retry_request_uses_its_own_countdown_and_limit_once():
    outcome = decide(delivery(3), Failed(ValueError(), countdown=30.2, max_retries=5), handling(max_retries=3), NOW)
    assert isinstance(outcome, Redeliver) and outcome.delay == 31  # rounded up: never early
    outcome = decide(delivery(3), Failed(ValueError(), countdown=30), handling(max_retries=3), NOW)
    assert isinstance(outcome, Archive) and outcome.reason == Reason.MAX_RETRIES


def test_a_countdown_of_zero_goes_straight_back():
    outcome = decide(delivery(), Failed(ValueError(), countdown=0), handling(), NOW)
    assert isinstance(outcome, Redeliver) and outcome.delay == 0
    assert (outcome.copy.exchange, outcome.copy.routing_key) == (
        "orders.direct",
        QUEUE,
    ) and DUE_AT not in outcome.copy.headers


def test_a_lost_pool_process_sends_it_back_at_once_counting_the_loss():
    outcome = decide(delivery(1), Lost(), handling(), NOW)
    assert isinstance(outcome, Redeliver) and outcome.why == "redeliver" and outcome.delay == 0
    assert (outcome.copy.exchange, outcome.copy.routing_key) == ("orders.direct", QUEUE)
    assert outcome.copy.headers[LOST_RUNS] == 1 and outcome.copy.headers["retries"] == 1  # not a retry
    assert isinstance(outcome.error, WorkerLost)


def test_too_many_lost_processes_archive_it_as_worker_lost():
    outcome = decide(delivery(1, **{LOST_RUNS: 2}), Lost(), handling(), NOW)
    assert isinstance(outcome, Archive) and outcome.reason == Reason.WORKER_LOST and outcome.attempts == 1 + 3


def test_a_message_that_cannot_run_counts_its_delivery_as_an_attempt_as_the_log_says():
    outcome = decide(delivery(2), CannotRun(Reason.BAD_ARGUMENTS, TypeError("no amount")), handling(), NOW)
    assert isinstance(outcome, Archive) and outcome.reason == Reason.BAD_ARGUMENTS and outcome.attempts == 3


def test_bad_input_is_archived_byte_for_byte_with_its_content_type():
    raw = Delivery(
        headers={"task": "x.y", "id": "raw-1", "x-death": [{"queue": "q"}]},
        queue="orders:x.y",
        exchange="events",
        routing_key="x.y",
        raw_body=b"\x80\x04pickle",
        content_type="application/x-python-serialize",
        content_encoding="binary",
    )
    plain = Handling("orders", "", RetryPolicy(max_retries=3), 3, 10)
    outcome = decide(raw, CannotRun(Reason.FORBIDDEN_CONTENT_TYPE, ValueError("pickle")), plain, NOW)
    assert isinstance(outcome, Archive)
    assert outcome.copy.body == b"\x80\x04pickle" and outcome.copy.content_type == "application/x-python-serialize"
    assert outcome.copy.headers["archive_routing_key"] == "x.y" and "x-death" not in outcome.copy.headers


def test_copies_keep_application_headers_and_drop_per_copy_ones():
    messy = delivery(1, tenant="acme", **{"x-death": [], DUE_AT: "old", LOST_RUNS: 1, "archive_reason": "old"})
    outcome = decide(messy, Failed(ValueError()), handling(), NOW)
    assert isinstance(outcome, Redeliver)
    headers = outcome.copy.headers
    assert headers["tenant"] == "acme" and "x-death" not in headers and LOST_RUNS not in headers
    assert headers[DUE_AT] != "old" and not set(ARCHIVE_HEADERS) & set(headers)


def test_returned_too_often_is_refused_before_it_runs():
    refused = refusal(delivery(**{"x-delivery-count": 10}), handling())
    assert isinstance(refused, CannotRun) and refused.reason == Reason.WORKER_LOST
    outcome = decide(delivery(**{"x-delivery-count": 10}), refused, handling(), NOW)
    assert isinstance(outcome, Archive) and outcome.attempts == 1  # it was running each time


def test_a_message_rejected_by_this_queue_counts_as_a_failed_attempt():
    death = {"queue": QUEUE, "reason": "rejected"}
    refused = refusal(delivery(**{"x-death": [death]}), handling())
    assert isinstance(refused, Failed) and isinstance(refused.error, Rejected)
    assert refusal(delivery(**{"x-death": [{**death, "queue": "other"}]}), handling()) is None
    assert refusal(delivery(), handling()) is None


def test_unreadable_counters_count_as_zero():
    assert delivery(retries="many").retries == 0  # type: ignore[arg-type]
    assert Delivery(headers={LOST_RUNS: "x"}, queue=QUEUE).lost_runs == 0
