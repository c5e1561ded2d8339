"""Coroutine handlers (``async def``) in real workers: the guarantees of a plain handler, on every pool that
can run them, and a clear refusal on the one that cannot."""

from __future__ import annotations

import pytest
from helpers import wait_archived

from amqp_events import Reason
from amqp_events.testing import wait_for


def runs(records, tag: str) -> list[int]:
    return [record["attempt"] for record in records.all() if record["tag"] == tag]


@pytest.mark.parametrize(("pool", "concurrency"), [("solo", 1), ("threads", 4), ("prefork", 2)])
def test_a_coroutine_handler_is_run_retried_and_archived_as_a_plain_one(
    pool, concurrency, worker, producer, records, archive_of
):
    worker("awaits", pool=pool, concurrency=concurrency)
    once = producer.fire("test.ping", ["once"], {})
    producer.fire("test.ping", ["flaky"], {"how": {"fail_times": 1}})
    doomed = producer.fire("test.ping", ["doomed"], {"how": {"permanent": True}})
    wait_for(
        lambda: (runs(records, "once"), runs(records, "flaky"), runs(records, "doomed")) == ([1], [1, 2], [1]) or None,
        60,
        what="each event run as its outcome says: once, retried once through the ladder, archived",
    )
    assert [record["id"] for record in records.all() if record["tag"] == "once"] == [once]  # current_event()
    [archived] = wait_archived(archive_of("awaits"), 1)
    assert archived.id == doomed and archived.reason == Reason.NON_RETRYABLE
    assert archived.handler == "services.awaits.on_ping" and "can never succeed" in archived.exception_message
    assert "Traceback" in archived.traceback


def test_sections_are_async_context_managers_in_a_coroutine_handler(worker, producer, records, archive_of):
    worker("awaits")
    producer.fire("test.sections", ["captured"], {"fail": {"notify": True, "capture": 1}})
    poisoned = producer.fire("test.sections", ["poisoned"], {"fail": {"parse": True}})
    wait_for(lambda: runs(records, "captured") == [1, 2] or None, 60, what="the retry section's own retry")
    [archived] = wait_archived(archive_of("awaits"), 1)
    assert archived.id == poisoned and archived.reason == Reason.POISONOUS and "parse" in archived.section


def test_a_soft_time_limit_cancels_the_coroutine_and_counts_as_a_failure(worker, producer, records):
    worker("awaits")
    producer.fire("test.slow", ["slow"], {"seconds": 30})
    wait_for(lambda: runs(records, "slow") == [1, 2] or None, 60, what="the cancelled run retried")


def test_a_gevent_worker_refuses_coroutine_handlers_with_a_clear_message(worker):
    process = worker("awaits", pool="gevent", concurrency=10, ready=False)
    wait_for(lambda: not process.is_running(), 60, what="the worker to stop")
    assert "cannot run under -P gevent" in process.log() and "-P solo" in process.log()
