"""Firing many events at once with ``app.batch()`` (real broker)."""

from __future__ import annotations

import time

import pytest

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
    assert record["time"] - fired >= 2


def test_a_delayed_event_without_a_ladder_is_an_error(producer):
    with pytest.raises(TopologyMissing, match="delay ladder"):
        producer.fire("test.ping", ["later"], {}, countdown=2)
