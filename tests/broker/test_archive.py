"""The archive: limits, listing without consuming, replay after a fix, purge, export/import (real broker)."""

from __future__ import annotations

import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import wait_archived

from amqp_events import Reason, events_app
from amqp_events.archive import Selection
from amqp_events.testing import wait_for
from amqp_events.topology.names import to_queue
from amqp_events.transport import browse
from amqp_events.wire.message import OutgoingMessage


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


@pytest.mark.parametrize("per_consumer", [browse.PREFETCH_MAX, 1500])
def test_an_archive_larger_than_a_consumer_may_hold_unacked_is_read_whole(per_consumer, broker_url, monkeypatch):
    """A quorum queue gives a consumer without a prefetch limit 2,000 messages at most; a browse of a bigger
    archive saw those alone (a purge by event matching later ones found nothing). With 1,500 a consumer, the
    browse takes four consumers."""
    monkeypatch.setattr(browse, "PREFETCH_MAX", per_consumer)
    shop = events_app("shop", broker_url=broker_url)
    shop.handler("shop.order.placed")(lambda order: None)
    shop.declare_topology()
    archive = shop.archive()
    publisher = shop.context.transport.batch(1000)
    for n in range(5000):
        event = "shop.order.placed" if n < 4990 else "shop.order.late"
        headers = {"task": event, "id": f"e{n}", "archive_reason": "max_retries"}
        publisher.publish(OutgoingMessage(*to_queue(archive.queue), headers, [[n], {}, None], f"e{n}"))
    publisher.wait()
    publisher.close()
    assert len(archive.list()) == 5000
    late = [f"e{n}" for n in range(4990, 5000)]
    assert [entry.id for entry in archive.list(Selection.of(event="shop.order.late"))] == late
    assert archive.purge(Selection.of(event="shop.order.late")) == late
    wait_for(lambda: archive.count() == 4990, 10, what="the others back in the archive")
    shop.close()


def test_a_browse_waits_for_another_one_of_the_same_archive_to_end(worker, producer, archive_of):
    """While one reader (a console's refresh) holds the archive's messages, another (`archive replay`) saw it
    empty: it waits for its turn instead."""
    worker("orders")
    archive = archive_of("orders")
    ids = fill(worker, producer, archive, 3)
    with ThreadPoolExecutor(1) as pool, producer.context.transport.browse(archive.queue) as holding:
        next(holding)  # the first reader holds every message, unacked
        second = pool.submit(archive.list)
        time.sleep(0.5)  # not a wait for an outcome: the overlap this test is about (the second waits 10 s at most)
    assert [entry.id for entry in second.result(timeout=30)] == ids


def test_two_browses_that_start_at_the_same_moment_each_read_every_message(worker, producer, archive_of, monkeypatch):
    """Two readers (a console's refresh and `archive purge`) that both count no consumer, then both consume: the
    messages go to the first, and the second, given nothing for a while (the first is slow), saw an empty archive
    (a purge found nothing to purge). The second sees the other's consumer and steps back until it is done."""
    worker("orders")
    archive = archive_of("orders")
    ids = fill(worker, producer, archive, 3)
    monkeypatch.setattr(browse, "BROWSE_IDLE", 0.3)
    both_counted, first_two = threading.Barrier(2, timeout=30), iter(range(2))
    slow, slow_has_one = threading.local(), threading.Event()
    counted = browse._after_other_browses

    def at_the_same_moment(channel, queue, deadline):
        waiting = counted(channel, queue, deadline)
        if next(first_two, None) is not None:  # each reader's first count meets the other's: neither consumes yet
            both_counted.wait()
            if not getattr(slow, "reader", False):  # and the slow one consumes first
                assert slow_has_one.wait(30)
        return waiting

    def slow_reader():
        slow.reader = True
        with producer.context.transport.browse(archive.queue) as held:
            first = next(held)
            slow_has_one.set()
            time.sleep(1.0)  # not a wait for an outcome: a reader slower than the other's idle wait
            return [first, *held]

    monkeypatch.setattr(browse, "_after_other_browses", at_the_same_moment)
    with ThreadPoolExecutor(2) as pool:
        held, listed = pool.submit(slow_reader), pool.submit(archive.list)
        assert len(held.result(timeout=60)) == 3
        assert [entry.id for entry in listed.result(timeout=60)] == ids
