"""A handler that kills its worker is retried a bounded number of times, then archived (real broker)."""

from __future__ import annotations

import pytest
from helpers import wait_archived

from amqp_events import Reason


@pytest.mark.parametrize("coroutines", ["0", "1"], ids=["plain", "async"])
def test_a_handler_that_sigkills_its_prefork_child_is_archived_as_worker_lost(
    coroutines, worker, producer, records, archive_of
):
    process = worker("orders", pool="prefork", concurrency=1, env={"COROUTINES": coroutines})
    event_id = producer.fire("test.ping", ["boom"], {"how": {"kill": True}})
    [archived] = wait_archived(archive_of("orders"), 1, timeout=60)
    assert archived.id == event_id and archived.reason == Reason.WORKER_LOST
    assert archived.exception_type.endswith("WorkerLost") and archived.attempts == 3
    assert len(records.all(id=event_id)) == 3  # the default amqp_events_max_deliveries
    assert process.is_running()
    producer.fire("test.ping", ["next"], {})
    records.wait(1, tag="next")


@pytest.mark.parametrize("coroutines", ["0", "1"], ids=["plain", "async"])
def test_a_solo_worker_killed_by_its_handler_and_restarted_ends_the_loop_too(
    coroutines, worker, producer, records, archive_of
):
    """No main process survives a solo worker: the broker's count of returns ends the loop."""
    env = {"MAX_REDELIVERIES": "3", "COROUTINES": coroutines}
    worker("orders", env=env).stop()  # declares the queues
    event_id = producer.fire("test.ping", ["boom"], {"how": {"kill": True}})
    for crash in range(3):
        process = worker("orders", ready=False, env=env)
        assert process.wait(30) is not None, "the handler should have killed its worker"
        assert len(records.all(id=event_id)) == crash + 1
    worker("orders", env=env)
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.id == event_id and archived.reason == Reason.WORKER_LOST


def test_killed_children_cost_only_the_message_they_ran(worker, producer, records, archive_of):
    """Prefetched messages of a prefork worker are not counted when a child dies running another one."""
    worker("orders", pool="prefork", concurrency=2)
    poison = producer.fire("test.ping", ["boom"], {"how": {"kill": True}})
    ids = [producer.fire("test.ping", [f"ok{n}"], {"how": {"sleep": 0.05}}) for n in range(40)]
    [archived] = wait_archived(archive_of("orders"), 1, timeout=60)
    assert archived.id == poison
    for event_id in ids:
        records.wait(1, id=event_id)
    assert archive_of("orders").count() == 1


def test_a_handler_that_exits_its_prefork_child_is_counted_as_a_lost_run(worker, producer, records, archive_of):
    """A SystemExit from the handler ends its pool process: each Celery line reports it its own way."""
    process = worker("orders", pool="prefork", concurrency=1)
    event_id = producer.fire("test.ping", ["exit"], {"how": {"exit": True}})
    [archived] = wait_archived(archive_of("orders"), 1, timeout=60)
    assert archived.id == event_id and archived.reason == Reason.WORKER_LOST and archived.attempts == 3
    assert len(records.all(id=event_id)) == 3
    assert process.is_running()


def test_a_message_given_out_more_than_rabbitmq_4_default_limit_is_archived_not_dropped(
    worker, producer, records, archive_of, broker_url
):
    """Consumers that vanish with a message (no outcome) more than 20 times: RabbitMQ 4.0's default delivery limit
    would dead-letter it into its own queue, which RabbitMQ drops as a cycle. The library's count decides."""
    from kombu import Connection

    env = {"MAX_REDELIVERIES": "25"}
    worker("orders", env=env).stop()  # declares the queues
    event_id = producer.fire("test.ping", ["vanishing"], {})
    with Connection(broker_url) as connection:
        for _ in range(25):
            channel = connection.channel()
            assert channel.basic_get("orders:test.ping", no_ack=False) is not None, "the message is gone"
            channel.close()
    worker("orders", env=env)
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.id == event_id and archived.reason == Reason.WORKER_LOST
    assert records.all(id=event_id) == []  # never run
