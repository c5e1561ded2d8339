"""A history replay sends a handler's events in batches; a worker runs each of them as if it had come alone
(real broker; the in-process mode is in tests/broker/test_history.py's contract tests)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

import pytest
from helpers import wait_archived
from kombu import Connection

from amqp_events import Reason
from amqp_events.history import Query
from amqp_events.wire.batch import MAX_EVENTS, REPLAY_BATCH

QUEUE = "orders:test.ping"


@pytest.mark.parametrize(("pool", "concurrency"), [("solo", 1), ("threads", 4), ("prefork", 2)])
def test_a_replay_batch_runs_each_event_once_and_retries_a_failing_one_alone(
    pool, concurrency, worker, producer, records, service_app, broker_url, monkeypatch
):
    """The threads and solo pools run a batch's events in place; the prefork pool's worker splits it first."""
    count = MAX_EVENTS + 20
    replayed_in_batches(service_app, producer, broker_url, monkeypatch, count, {7: {"fail_times": 1}})
    assert producer.context.transport.count(QUEUE) == 2  # a full batch and the rest

    worker("orders", pool=pool, concurrency=concurrency, env={"HISTORY": "1"})
    records.wait(count + 1, timeout=60)  # p7 failed once, and ran again alone, after its retry delay
    runs = Counter(run["tag"] for run in records.all(service="orders"))
    assert runs == {f"p{n}": 2 if n == 7 else 1 for n in range(count)}
    assert [run["attempt"] for run in records.all(tag="p7")] == [1, 2]
    assert {run["event"] for run in records.all()} == {"test.ping"}


def test_an_event_of_a_batch_that_a_before_receive_hook_refuses_is_archived_alone(
    worker, producer, records, service_app, broker_url, monkeypatch, archive_of
):
    replayed_in_batches(service_app, producer, broker_url, monkeypatch, 10, {})
    worker("orders", env={"HISTORY": "1", "REFUSE_TAG": "p3"})
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.reason == Reason.UNDECODABLE and archived.exception_message == "tag 'p3' is refused"
    assert archived.payload[0] == ["p3"]
    records.wait(9)
    assert sorted(run["tag"] for run in records.all(service="orders")) == sorted(f"p{n}" for n in range(10) if n != 3)


def replayed_in_batches(service_app, producer, broker_url, monkeypatch, count: int, how: dict) -> None:
    """``count`` pings (``how[n]``: what the handler does with the n-th) kept only by the history, then
    replayed to the orders service's handler (while none of its workers runs)."""
    monkeypatch.setenv("HISTORY", "1")
    orders = service_app("orders")
    orders.declare_topology()
    since = orders.context.clock.now() - timedelta(seconds=1)
    for n in range(count):
        producer.fire("test.ping", [f"p{n}"], {"how": how.get(n)})
    with Connection(broker_url) as connection:  # the service lost them: only the history has them
        connection.default_channel.queue_purge(QUEUE)
    report = orders.history().replay(Query(since=since, events="test.ping"), handler="on_ping", rate=0).run()
    assert report.replayed == count


def test_a_replay_batch_that_cannot_be_read_is_archived_whole(worker, broker_url, archive_of):
    worker("orders")
    body = json.dumps([{"headers": {"task": "test.ping", "id": "e1"}, "body": "not [args, kwargs, embed]"}])
    with Connection(broker_url) as connection:
        connection.Producer().publish(
            body.encode("utf-8"),
            exchange="",
            routing_key=QUEUE,
            headers={"task": "test.ping", "id": "batch-1", REPLAY_BATCH: 1},
            content_type="application/json",
            content_encoding="utf-8",
            user_id="guest",  # the service's own user, as a replay's batch is: another's is no batch at all
        )
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.reason == Reason.UNDECODABLE and archived.queue == QUEUE
    assert "event 0 of a replay batch is not" in archived.exception_message
    assert archived.body == body.encode("utf-8")  # kept as it came


def test_a_batch_from_another_user_than_the_service_s_is_no_batch(worker, broker_url, archive_of, records):
    """Only the service's own replay sends batches: from anyone else the header is dropped and the message is what
    its body is (here: not an event)."""
    worker("orders")
    entry = {"headers": {"task": "test.ping", "id": "e1", "fired_by": "orders"}, "body": [["smuggled"], {}, None]}
    with Connection(broker_url) as connection:  # no user_id: nothing verifies who sent it
        connection.Producer().publish(
            json.dumps([entry]).encode("utf-8"),
            exchange="",
            routing_key=QUEUE,
            headers={"task": "test.ping", "id": "batch-2", REPLAY_BATCH: 1},
            content_type="application/json",
            content_encoding="utf-8",
        )
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.reason == Reason.UNDECODABLE and REPLAY_BATCH not in archived.headers
    assert not records.all(tag="smuggled")
