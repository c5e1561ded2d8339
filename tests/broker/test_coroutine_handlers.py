"""Coroutine handlers (``async def``) in real workers: the guarantees of a plain handler, on every pool that
can run them, and a clear refusal on the one that cannot."""

from __future__ import annotations

import os
import signal

import pytest
from helpers import queue_state, unconsumed, wait_archived

from amqp_events import Reason
from amqp_events.testing import wait_for
from amqp_events.topology.names import slot_of


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


@pytest.mark.parametrize(("pool", "concurrency"), [("solo", 1), ("threads", 2), ("consuming", 1)])
def test_coroutine_handlers_wait_on_io_together_in_one_worker(pool, concurrency, worker, producer, records):
    """Each handler waits until all 40 are in flight at once: run one after another, each would time out. The
    consuming pool (no -P: the command as typed) with one process, which runs them as a solo worker does."""
    if pool == "consuming":
        worker("awaits", "-c", "1", "--loglevel=INFO", as_written=True)
    else:
        worker("awaits", pool=pool, concurrency=concurrency)
    for n in range(40):
        producer.fire("test.together", [f"t{n}"], {"group": pool, "size": 40})
    done = wait_for(lambda: len(ran := records.all(event="test.together", hook=None)) == 40 and ran, 90, what="runs")
    assert all(record["together"] for record in done), done
    assert len({record["pid"] for record in done}) == 1
    hooks = records.all(hook=True)  # a middleware's async before_handle: awaited on the handlers' loop
    assert len(hooks) == 40 and {hook["loop"] for hook in hooks} == {record["loop"] for record in done}
    wait_for(lambda: queue_state(producer, "awaits:test.together") == (0, 1) or None, 30, what="every message acked")


def test_a_warm_shutdown_lets_running_coroutines_finish(worker, producer, records):
    process = worker("awaits")
    for n in range(5):
        producer.fire("test.lingering", [f"l{n}"], {"seconds": 2})
    records.wait(5, timeout=60, state="started")
    assert process.stop(timeout=60) == 0
    assert len(records.all(state="finished")) == 5
    assert unconsumed(producer, "awaits:test.lingering") == 0  # all acked before the connection closed


def test_a_warm_shutdown_gives_back_what_is_still_running_after_its_bound(worker, producer, records):
    process = worker("awaits", env={"SHUTDOWN_TIMEOUT": "1"})
    for n in range(5):
        producer.fire("test.lingering", [f"l{n}"], {"seconds": 3600})
    records.wait(5, timeout=60, state="started")
    assert process.stop(timeout=60) == 0  # a warm shutdown: nothing killed
    assert "5 coroutine handler(s) still running" in process.log()
    assert not records.all(state="finished")
    assert unconsumed(producer, "awaits:test.lingering") == 5  # back on the broker, to run again


def test_a_warm_shutdown_of_a_threads_worker_finishes_an_ordered_coroutine_handler_in_flight(worker, producer, records):
    """An ordered lane's thread waits on the coroutines' loop, which the consumer's event loop steps: the worker
    stops its pool and lanes after its consumer, and the loop must still run for them."""
    process = worker("ledger", pool="threads", concurrency=2, env={"COROUTINES": "1"})
    producer.fire("accounts.money.moved", ["acct-1", 1], {"how": {"announce": True, "sleep": 2}})
    records.wait(1, timeout=60, state="started")
    assert process.stop(timeout=60) == 0
    assert [record["seq"] for record in records.all(service="ledger", ok=True)] == [1]
    partition = f"ledger.ordered.0{int(slot_of('acct-1')) % 4}"
    assert unconsumed(producer, partition) == 0  # acked before the connection closed


def test_a_coroutine_waiting_on_a_socket_or_a_timer_goes_on_after_the_connection_is_lost(
    rabbitmq, vhost, worker, producer, records, tmp_path
):
    """The worker's event loop is reset when its connection is lost: the coroutines' loop is stepped again for
    its sockets and its timers."""
    if rabbitmq.node is None:
        pytest.skip("needs the harness's own node (not $AMQP_URL) to close the worker's connection")
    process = worker("awaits")
    # The handlers wait until the worker has connected again, not for a time: the lost connection must find them
    # in flight, however long closing it takes on a loaded machine.
    reconnected = tmp_path / "reconnected"
    producer.fire("test.reply", ["reply"], {"seconds": 0, "until": str(reconnected)})
    producer.fire("test.lingering", ["lingering"], {"seconds": 0, "until": str(reconnected)})
    records.wait(2, timeout=60, state="started")
    rabbitmq.node.rabbitmqctl("close_all_connections", "-p", vhost, "closed by the test")
    wait_for(lambda: process.log().count("Connected to amqp") >= 2, 60, what="the worker connected again")
    reconnected.touch()
    # The runs in flight finish (their acks are refused with the old channel), and the redelivered copies run.
    finished = records.wait(4, timeout=60, state="finished")
    assert sorted(record["tag"] for record in finished) == ["lingering", "lingering", "reply", "reply"]
    assert {record["thread"] for record in finished if record["tag"] == "reply"} == {"MainThread"}  # the consumer's
    for queue in ("awaits:test.reply", "awaits:test.lingering"):
        wait_for(lambda q=queue: queue_state(producer, q) == (0, 1) or None, 30, what=f"{queue} acked")


def test_the_command_as_typed_counts_each_coroutine_of_a_killed_process_lost_and_finishes_them_when_stopped(
    worker, producer, records, archive_of
):
    """The consuming pool's process runs several coroutines at once: a SIGKILL loses each of them (counted, and
    archived after the limit of lost runs), and a warm shutdown lets each finish."""
    process = worker("awaits", "-c", "1", "--loglevel=INFO", as_written=True)
    stuck = {producer.fire("test.lingering", [f"stuck{n}"], {"seconds": 3600}) for n in range(3)}
    for kill in range(1, 4):
        started = records.wait(3 * kill, timeout=60, state="started")
        assert len({record["pid"] for record in started[-3:]}) == 1  # the three at once, in one process
        os.kill(started[-1]["pid"], signal.SIGKILL)
        wait_for(lambda k=kill: process.log().count("was killed by SIGKILL") == k, 30, what="the death seen")
    archived = wait_archived(archive_of("awaits"), 3, timeout=60)
    assert {message.id for message in archived} == stuck
    assert {message.reason for message in archived} == {Reason.WORKER_LOST}
    finishing = [producer.fire("test.lingering", [f"finish{n}"], {"seconds": 2}) for n in range(3)]
    wait_for(lambda: {r["id"] for r in records.all(state="started")} >= set(finishing), 60, what="all three started")
    os.kill(process.pid, signal.SIGTERM)
    assert process.wait(60) == 0
    assert {record["id"] for record in records.all(state="finished")} == set(finishing)
    assert unconsumed(producer, "awaits:test.lingering") == 0  # each acked before its connection closed
