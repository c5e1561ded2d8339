"""``celery -A app worker`` as typed (no -P): the consuming pool, whose processes each hold a connection and consume,
against a real broker: what prefork users rely on holds (kill -9, recycling, time limits, warm shutdown, remote
control, breakers)."""

from __future__ import annotations

import json
import os
import signal
from urllib.parse import quote

import pytest
from helpers import celery, control, queue_state, wait_archived

from amqp_events import Reason
from amqp_events.testing import wait_for

pytestmark = pytest.mark.broker


def typed(worker, *extra: str, env: dict[str, str] | None = None):
    """``celery -A services.orders worker -c 2`` with no pool named (and INFO logs, for its "ready." line)."""
    return worker("orders", "-c", "2", "--loglevel=INFO", *extra, as_written=True, env=env)


def consumers_of(rabbitmq, vhost: str, queue: str) -> list[dict]:
    """The queue's consumers whose channel the management plugin has described (until its stats arrive, a
    consumer's ``channel_details`` is an empty list)."""
    found = rabbitmq.management.request("GET", f"/api/consumers/{quote(vhost, safe='')}")
    return [consumer for consumer in found if consumer["queue"]["name"] == queue and consumer["channel_details"]]


def processes_of(process) -> list[int]:
    return wait_for(lambda: len(found := process.children()) == 2 and found, 30, what="the pool's two processes")


def test_the_command_as_typed_runs_processes_that_each_consume_and_the_main_process_none(
    worker, producer, records, rabbitmq, vhost
):
    process = typed(worker)
    children = processes_of(process)
    consumers = wait_for(
        lambda: len(found := consumers_of(rabbitmq, vhost, "orders:test.ping")) == 2 and found,
        30,
        what="two consumers of the queue",
    )
    assert len({consumer["channel_details"]["connection_name"] for consumer in consumers}) == 2  # one each
    ids = [producer.fire("test.ping", [f"p{n}"], {"how": {"sleep": 0.01}}) for n in range(200)]
    for event_id in ids:
        records.wait(1, id=event_id)
    ran = records.all(service="orders")
    assert sorted(record["id"] for record in ran) == sorted(ids)  # each once
    assert {record["pid"] for record in ran} == set(children)  # both, and never the main process
    assert "concurrency: 2 (consuming)" in process.log()  # the banner names the pool


def test_a_process_killed_mid_run_counts_a_lost_run_is_replaced_and_what_it_had_prefetched_is_not_counted(
    worker, producer, records, archive_of
):
    process = typed(worker)
    processes_of(process)
    poison = producer.fire("test.ping", ["boom"], {"how": {"kill": True}})
    ids = [producer.fire("test.ping", [f"ok{n}"], {"how": {"sleep": 0.02}}) for n in range(60)]
    [archived] = wait_archived(archive_of("orders"), 1, timeout=60)
    assert archived.id == poison and archived.reason == Reason.WORKER_LOST and archived.attempts == 3
    assert len(records.all(id=poison)) == 3  # the default amqp_events_max_deliveries
    for event_id in ids:
        records.wait(1, id=event_id)
    assert archive_of("orders").count() == 1  # nothing it had only prefetched was counted against
    wait_for(lambda: process.log().count("was killed by SIGKILL") == 3, 30, what="three deaths seen")
    processes_of(process)  # each replaced
    assert process.is_running()


def test_max_tasks_per_child_recycles_processes_without_losing_or_repeating_a_message(worker, producer, records):
    process = typed(worker, "--max-tasks-per-child", "10")
    ids = [producer.fire("test.ping", [f"r{n}"], {}) for n in range(100)]
    for event_id in ids:
        records.wait(1, id=event_id)
    ran = records.all(service="orders")
    assert sorted(record["id"] for record in ran) == sorted(ids)
    assert len({record["pid"] for record in ran}) >= 6  # each process ran at most 10 (2 x 100/10, less prefetch)
    assert "recycled after 10 messages" in process.log()
    processes_of(process)


def test_max_memory_per_child_recycles_the_process_over_it_and_only_that_one_without_losing_a_message(
    worker, producer, records
):
    process = typed(worker, "--max-memory-per-child", "200000")  # KiB: a process at rest is a quarter of it
    before = set(processes_of(process))
    big = producer.fire("test.ping", ["big"], {"how": {"allocate_mb": 250}})
    [ran_big] = records.wait(1, id=big)
    wait_for(lambda: set(process.children()) - before, 30, what="the process that ran it replaced")
    ids = [producer.fire("test.ping", [f"m{n}"], {}) for n in range(40)]
    for event_id in ids:
        records.wait(1, id=event_id)
    assert sorted(r["id"] for r in records.all(service="orders")) == sorted([big, *ids])  # each once
    after = set(processes_of(process))
    assert before - after == {ran_big["pid"]}  # the other process, never over the limit, kept on
    assert process.log().count("recycled at") == 1 and "--max-memory-per-child 200000" in process.log()


def test_a_run_past_its_hard_time_limit_is_killed_counted_as_lost_and_archived_after_the_limit(
    worker, producer, records, archive_of
):
    process = typed(worker, "--time-limit", "1")
    stuck = producer.fire("test.ping", ["stuck"], {"how": {"sleep": 60}})
    [archived] = wait_archived(archive_of("orders"), 1, timeout=60)
    assert archived.id == stuck and archived.reason == Reason.WORKER_LOST
    assert len(records.all(id=stuck)) == 3
    assert "hard time limit (1.0s) of services.orders.on_ping exceeded" in process.log()
    producer.fire("test.ping", ["after"], {})
    records.wait(1, tag="after")


def test_a_soft_time_limit_fails_the_run_inside_the_handler(worker, producer, records):
    typed(worker, env={"TIME_LIMIT": "0.5", "MAX_RETRIES": "0"})
    slow = producer.fire("test.ping", ["slow"], {"how": {"sleep": 30}})
    wait_for(
        lambda: any(r["id"] == slow for r in records.all()) and producer.archive("orders").count() == 1,
        30,
        what="the slow run archived",
    )
    [archived] = producer.archive("orders").list()
    assert archived.exception_type.endswith("SoftTimeLimitExceeded")


def test_a_warm_shutdown_lets_each_process_finish_its_run_and_loses_nothing(worker, producer, records, archive_of):
    process = typed(worker)
    processes_of(process)
    ids = [producer.fire("test.ping", [f"w{n}"], {"how": {"sleep": 1.5}}) for n in range(2)]
    wait_for(lambda: len(records.all(service="orders")) == 2, 30, what="both runs started")
    os.kill(process.pid, signal.SIGTERM)
    assert process.wait(30) == 0
    assert sorted(r["id"] for r in records.all(service="orders")) == sorted(ids)
    assert "Traceback" not in process.log()
    wait_for(lambda: process.children() == [], 10, what="no process left")


def test_remote_control_reaches_the_main_process_breakers_stop_the_processes_consuming_and_shutdown_stops_all(
    worker, producer, records, broker_url, cli
):
    process = typed(worker)
    processes_of(process)
    consumers = lambda: queue_state(producer, "orders:test.ping")[1]  # noqa: E731
    wait_for(lambda: consumers() == 2, 30, what="two consumers")
    ping = celery(broker_url, "inspect", "ping", "--json")
    assert len(json.loads(ping.stdout)) == 1, ping.stdout  # one worker answers, not each process
    assert "open: 1 worker(s)" in cli("breakers", "open", "on_ping").output
    wait_for(lambda: consumers() == 0, 30, what="neither process consuming the paused queue")
    held = producer.fire("test.ping", ["held"], {})
    cli("breakers", "close", "on_ping")
    wait_for(lambda: consumers() == 2, 30, what="both consuming again")
    records.wait(1, id=held)
    # Celery's worker stops without replying to it, so the command says that none did (with any pool).
    celery(broker_url, "control", "shutdown", "--timeout", "1")
    assert process.wait(30) == 0  # a warm shutdown of the whole worker, its processes with it
    wait_for(lambda: process.children() == [], 10, what="no process left")
    assert consumers() == 0 and "Traceback" not in process.log()


def test_cancel_consumer_stops_every_process_consuming_the_queue_a_replaced_one_too_until_add_consumer(
    worker, producer, records, rabbitmq, vhost, broker_url
):
    process = typed(worker)
    before = set(processes_of(process))
    wait_for(lambda: queue_state(producer, "orders:test.ping")[1] == 2, 30, what="two consumers")
    assert "no longer consuming from orders:test.ping" in control(broker_url, "cancel_consumer", "orders:test.ping")
    wait_for(lambda: queue_state(producer, "orders:test.ping")[1] == 0, 30, what="neither process consuming it")
    held = [producer.fire("test.ping", [f"held{n}"], {}) for n in range(50)]  # a process consuming it takes some

    def connections() -> set[str]:  # of the processes consuming another queue of the worker
        return {c["channel_details"]["connection_name"] for c in consumers_of(rabbitmq, vhost, "orders:test.sections")}

    old = wait_for(lambda: len(found := connections()) == 2 and found, 30, what="both consuming another queue")
    os.kill(sorted(before)[0], signal.SIGKILL)  # its replacement starts with the queue cancelled
    # Consuming another queue, the new process consumes every queue it was going to from the start.
    wait_for(lambda: len(connections() - old) == 1, 60, what="the killed process replaced, and consuming")
    assert queue_state(producer, "orders:test.ping") == (50, 0) and not records.all(event="test.ping")
    assert "add consumer orders:test.ping" in control(broker_url, "add_consumer", "orders:test.ping")
    for event_id in held:
        records.wait(1, id=event_id)
    wait_for(lambda: queue_state(producer, "orders:test.ping")[1] == 2, 30, what="both consuming it again")


def test_add_consumer_starts_a_queue_of_the_app_the_worker_was_not_started_with(worker, producer, records, broker_url):
    process = typed(worker, "-Q", "orders:test.ping")
    processes_of(process)
    ping = producer.fire("test.ping", ["ping"], {})
    records.wait(1, id=ping)  # the processes consume
    later = producer.fire("test.orders_only", ["later"], {})
    assert queue_state(producer, "orders:test.orders_only") == (1, 0)  # no consumer: -Q left it out
    assert "add consumer orders:test.orders_only" in control(broker_url, "add_consumer", "orders:test.orders_only")
    records.wait(1, id=later)


def test_autoscale_is_refused_with_the_way_out(worker):
    process = worker("orders", "--autoscale", "4,2", as_written=True, ready=False)
    assert process.wait(60) not in (None, 0)
    assert "--autoscale is not supported by the consuming pool (the default): give -c N, or -P prefork" in process.log()
