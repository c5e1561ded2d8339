"""Firing many events at once with ``app.batch()`` (real broker)."""

from __future__ import annotations

import threading
import time

import amqp
import pytest
from helpers import assert_broker_waited

from amqp_events import TopologyMissing


def test_events_fired_in_a_batch_are_all_delivered_once(worker, producer, records):
    worker("orders")

    @producer.event("test.ping")
    def ping(tag: str):
        if not tag:
            raise ValueError("tag required")

    with producer.batch(window=50) as batch:
        returned = [ping(f"b{n}") for n in range(300)]
        with pytest.raises(ValueError):
            ping("")  # validation still runs at each call
        producer.fire("nobody.listens", [], {})
    assert batch.ids[:300] == returned and len(batch.ids) == 301
    seen = records.wait(300, timeout=60)
    assert sorted(record["id"] for record in seen) == sorted(returned)
    records.barrier(producer, ("orders",))
    assert len(records.all()) == 300


def test_delayed_events_in_a_batch(worker, producer, records):
    worker("orders")
    fired = time.time()
    with producer.batch():
        producer.fire("test.ping", ["later"], {}, countdown=2)
    [record] = records.wait(1)
    assert_broker_waited(record["time"] - fired, 2)


def test_a_delayed_event_without_a_ladder_is_an_error(producer):
    with pytest.raises(TopologyMissing, match="delay ladder"):
        producer.fire("test.ping", ["later"], {}, countdown=2)


def test_publishing_reads_the_socket_only_for_confirms(producer, monkeypatch):
    """py-amqp polls the socket before every publish on a connection that negotiated ``connection.blocked``
    (``drain_events(timeout=0)``); the publishers read it for their confirms, where a notice is read too."""
    polls: list[float | None] = []
    drain = amqp.Connection.drain_events
    here = threading.get_ident()

    def counted(connection, timeout=None):
        if threading.get_ident() == here:
            polls.append(timeout)
        return drain(connection, timeout)

    monkeypatch.setattr(amqp.Connection, "drain_events", counted)
    with producer.batch(window=100):
        for n in range(500):
            producer.fire("test.ping", [f"b{n}"], {})
    for n in range(20):
        producer.fire("test.ping", [f"one{n}"], {})
    assert polls, "the confirms were read"
    assert 0 not in polls, "a poll before a publish"
