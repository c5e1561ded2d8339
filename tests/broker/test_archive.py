"""The archive: limits, listing without consuming, replay after a fix, purge, export/import (real broker)."""

from __future__ import annotations

import io

import pytest
from helpers import wait_archived

from amqp_events import Reason
from amqp_events.archive import Selection
from amqp_events.testing import wait_for


def fill(worker, producer, archive, count, event="test.ping"):
    """``count`` archived messages from real failing handlers (non-retryable: archived at once)."""
    ids = [producer.fire(event, [f"p{n}"], {"how": {"permanent": True}}) for n in range(count)]
    wait_archived(archive, count)
    return ids


def test_listing_does_not_consume(worker, producer, archive_of):
    worker("orders")
    archive = archive_of("orders")
    ids = fill(worker, producer, archive, 3)
    assert [entry.id for entry in archive.list()] == ids
    assert [entry.id for entry in archive.list()] == ids
    # Given back when the browsing channel closes, which the broker finishes a moment after the client.
    wait_for(lambda: archive.count() == 3, 10, what="the listed messages back in the archive")
    assert archive.get(ids[1]).reason == Reason.NON_RETRYABLE
    assert archive.get("no-such-id") is None


def test_replay_after_a_fix_handles_each_message_once_and_empties_the_archive(worker, producer, records, archive_of):
    process = worker("orders")
    archive = archive_of("orders")
    ids = fill(worker, producer, archive, 3)
    process.stop()
    worker("orders", env={"FIXED": "1"})  # the fix is deployed
    report = archive.replay()
    assert report.replayed == ids and report.unroutable == []
    assert archive.count() == 0
    for event_id in ids:
        records.wait(2, id=event_id)
    records.barrier(producer, ("orders",))
    for event_id in ids:  # failed once, then handled once after the replay (attempt count reset)
        assert [run["attempt"] for run in records.all(id=event_id)] == [1, 1]


def test_replay_selects_by_id_event_and_limit(worker, producer, archive_of):
    process = worker("orders")
    archive = archive_of("orders")
    pings = fill(worker, producer, archive, 3)
    producer.fire("test.orders_only", ["o"], {"how": {"permanent": True}})
    wait_archived(archive, 4)
    process.stop()
    assert archive.replay(Selection.of(ids=[pings[1]])).replayed == [pings[1]]
    assert [entry.id for entry in archive.list()] == [pings[0], pings[2], archive.list()[-1].id]
    assert len(archive.replay(Selection.of(event="test.orders_only")).replayed) == 1
    assert archive.replay(Selection.of(limit=1)).replayed == [pings[0]]
    assert [entry.id for entry in archive.list()] == [pings[2]]


def test_purge_and_export_import_round_trip(worker, producer, archive_of, tmp_path):
    worker("orders")
    archive = archive_of("orders")
    ids = fill(worker, producer, archive, 3)
    out = io.StringIO()
    assert archive.export(out) == 3 and archive.count() == 3
    assert archive.purge(Selection.of(ids=[ids[0]])) == [ids[0]]
    assert archive.purge() == ids[1:] and archive.count() == 0
    assert archive.load(io.StringIO(out.getvalue())) == 3
    restored = archive.list()
    assert [entry.id for entry in restored] == ids and {entry.reason for entry in restored} == {Reason.NON_RETRYABLE}


@pytest.mark.parametrize("limit", [2])
def test_the_archive_is_bounded_by_length_keeping_the_newest(limit, worker, producer, archive_of):
    process = worker("orders", env={"AMQP_EVENTS_ARCHIVED_QUEUE_LENGTH": str(limit)})
    archive = archive_of("orders")
    ids = [producer.fire("test.ping", [f"p{n}"], {"how": {"permanent": True}}) for n in range(4)]
    # Not browsed before all are in: a browse holds messages unacked, and the broker counts only the ready
    # ones against the length. The line is logged once the broker confirmed the copy in the archive.
    wait_for(lambda: f"archived event=test.ping service=orders id={ids[-1]}" in process.log(), 20, what="p3 archived")
    assert [entry.id for entry in archive.list()] == ids[-limit:]


def test_the_archive_is_bounded_by_ttl(worker, producer, archive_of):
    worker("orders", env={"AMQP_EVENTS_ARCHIVED_MESSAGE_TTL": "1500"})
    archive = archive_of("orders")
    fill(worker, producer, archive, 1)
    wait_for(lambda: archive.count() == 0, 10, what="the archived message to expire")


def test_zero_limits_mean_unbounded_not_drop_everything(worker, producer, archive_of, rabbitmq, vhost):
    worker("orders", env={"AMQP_EVENTS_ARCHIVED_MESSAGE_TTL": "0", "AMQP_EVENTS_ARCHIVED_QUEUE_LENGTH": "0"})
    archive = archive_of("orders")
    fill(worker, producer, archive, 3)  # a TTL or a length of 0 would keep none of them
    [queue] = [queue for queue in rabbitmq.management.queues(vhost) if queue["name"] == "orders.archive"]
    assert "x-message-ttl" not in queue["arguments"] and "x-max-length" not in queue["arguments"]
    assert archive.count() == 3


def test_an_archive_that_does_not_exist_is_a_clear_error(producer):
    with pytest.raises(Exception, match=r"NOT_FOUND.*nobody\.archive"):
        producer.archive("nobody").list()


def test_reading_the_archive_many_times_loses_nothing(worker, producer, archive_of):
    """Browsing takes messages and gives them back, which RabbitMQ counts as deliveries: on RabbitMQ 4.0 an archive
    with the default delivery limit (20) would drop a message on its 21st read."""
    worker("orders")
    archive = archive_of("orders")
    ids = fill(worker, producer, archive, 2)
    for _ in range(25):
        assert [entry.id for entry in archive.list()] == ids
