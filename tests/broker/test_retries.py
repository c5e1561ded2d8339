"""Broker-side retries: backoff, exact attempt counts, destination routing, delays (real broker)."""

from __future__ import annotations

import itertools
import time

import pytest
from helpers import assert_broker_waited, wait_archived

from amqp_events import Reason


def gaps(records: list[dict]) -> list[float]:
    times = sorted(record["time"] for record in records)
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def test_failures_are_retried_with_exponential_backoff_never_early(worker, producer, records):
    worker("orders")
    producer.fire("test.ping", ["flaky"], {"how": {"fail_times": 3}})
    runs = records.wait(4, service="orders")
    assert [run["attempt"] for run in runs] == [1, 2, 3, 4]
    for gap, delay in zip(gaps(runs), [1, 2, 4], strict=True):
        assert gap >= delay, gaps(runs)  # never early


def test_a_retry_reaches_only_the_service_that_failed(worker, producer, records):
    worker("orders")
    worker("shipping")
    producer.fire("test.ping", ["once"], {"how": {"fail_times": 2, "only": "orders"}})
    records.wait(3, service="orders")
    records.barrier(producer, ("shipping",))  # a misrouted retry would be in shipping's queue by now
    assert len(records.all(service="shipping")) == 1
    assert len(records.all(service="orders")) == 3


@pytest.mark.parametrize("max_retries", [0, 1, 3])
def test_exactly_max_retries_plus_one_attempts_then_the_archive(max_retries, worker, producer, records, archive_of):
    worker("orders", env={"HANDLER_MAX_RETRIES": str(max_retries)})
    event_id = producer.fire("test.orders_only", ["doomed"], {"how": {"always_fail": True}})
    [archived] = wait_archived(archive_of("orders"), 1, timeout=30)
    runs = records.all(id=event_id)
    assert len(runs) == max_retries + 1
    assert archived.id == event_id and archived.reason == Reason.MAX_RETRIES
    assert archived.attempts == max_retries + 1
    assert archived.exception_type.endswith("Flaky") and "failed on attempt" in archived.exception_message
    assert "Traceback" in archived.traceback and len(archived.traceback) <= 4096
    assert archived.handler == "services.orders.on_orders_only" and archived.service == "orders"
    assert archived.first_failure_at <= archived.archived_at


def test_the_retry_count_does_not_drift_over_many_messages(worker, producer, records, archive_of):
    """self.retry(max_retries=1) must mean two attempts for every message, not a growing number."""
    worker("orders")
    how = {"countdown": 1, "countdown_times": 99, "retry_max_retries": 1}
    ids = [producer.fire("test.ping", [f"m{n}"], {"how": how}) for n in range(6)]
    wait_archived(archive_of("orders"), 6, timeout=40)
    for event_id in ids:
        assert [run["attempt"] for run in records.all(id=event_id)] == [1, 2]


def test_retry_with_a_countdown_waits_that_long_on_the_broker(worker, producer, records):
    worker("orders")
    producer.fire("test.ping", ["later"], {"how": {"countdown": 5}})
    first, second = records.wait(2, service="orders")
    assert_broker_waited(second["time"] - first["time"], 5)


def test_an_event_fired_with_a_countdown_reaches_every_subscriber_after_it(worker, producer, records):
    worker("orders")
    worker("shipping")
    fired = time.time()
    event_id = producer.fire("test.ping", ["delayed"], {}, countdown=3)
    runs = records.wait(2)
    assert {run["service"] for run in runs} == {"orders", "shipping"}
    for run in runs:
        assert run["id"] == event_id
        assert_broker_waited(run["time"] - fired, 3)
    records.barrier(producer, ("orders", "shipping"))
    assert len(records.all()) == 2


def test_a_non_retryable_failure_is_archived_at_once(worker, producer, records, archive_of):
    worker("orders")
    event_id = producer.fire("test.ping", ["bad"], {"how": {"permanent": True}})
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.id == event_id and archived.reason == Reason.NON_RETRYABLE and archived.attempts == 1
    assert len(records.all(id=event_id)) == 1


def test_a_rejected_message_is_counted_retried_and_archived_never_lost(worker, producer, records, archive_of):
    worker("orders", env={"HANDLER_MAX_RETRIES": "2"})
    event_id = producer.fire("test.orders_only", ["reject"], {"how": {"reject": True}})
    [archived] = wait_archived(archive_of("orders"), 1, timeout=30)
    assert archived.id == event_id and archived.reason == Reason.MAX_RETRIES
    assert archived.exception_type.endswith("Rejected")
    assert [run["attempt"] for run in records.all(id=event_id)] == [1, 2, 3]


def test_retry_options_it_cannot_honour_are_a_clear_error(worker, producer, archive_of):
    worker("orders", env={"HANDLER_MAX_RETRIES": "0"})
    how = {"retry_with": {"countdown": 1, "priority": 5, "queue": "elsewhere"}}
    event_id = producer.fire("test.orders_only", ["options"], {"how": how})
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.id == event_id and archived.exception_type == "builtins.TypeError"
    assert "priority, queue" in archived.exception_message and "self.retry()" in archived.exception_message
