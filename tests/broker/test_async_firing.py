"""Firing from asyncio: ``await event.fire_async(...)``, ``await app.fire_async(...)`` and ``async with
app.batch_async():`` on a real broker, received by a real worker."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import datetime
from typing import Any

import pytest
from helpers import assert_broker_waited
from kombu import Connection, Exchange, Queue

from amqp_events import PublishError, TopologyMissing, events_app
from amqp_events.local.processes import free_port
from amqp_events.testing import wait_for


def test_events_fired_from_a_coroutine_are_validated_confirmed_and_delivered_once(worker, producer, records):
    worker("orders")

    @producer.event("test.ping")
    def ping(tag: str):
        if not tag:
            raise ValueError("tag required")

    async def fire() -> list[str]:
        fired = [await ping.fire_async(f"a{n}") for n in range(20)]
        fired.append(await producer.fire_async("test.ping", [], {"tag": "by-name"}))
        with pytest.raises(ValueError, match="tag required"):
            await ping.fire_async("")  # validated before anything is sent
        await producer.close_async()
        return fired

    fired = asyncio.run(fire())
    seen = records.wait(21, timeout=60)
    assert sorted(record["id"] for record in seen) == sorted(fired)
    records.barrier(producer, ("orders",))
    assert len(records.all()) == 21


def test_an_async_batch_collects_the_confirms_of_everything_fired_in_it(worker, producer, records):
    worker("orders")

    @producer.event("test.ping")
    def ping(tag: str): ...

    async def fire() -> Any:
        async with producer.batch_async(window=40) as batch:
            for n in range(300):
                await ping.fire_async(f"b{n}")
            ping("plain")  # a plain call inside the block joins it
            await producer.fire_async("nobody.listens", [], {})
        await producer.close_async()
        return batch

    batch = asyncio.run(fire())
    assert len(batch.ids) == 302
    seen = records.wait(301, timeout=90)
    assert sorted(record["id"] for record in seen) == sorted(batch.ids[:301])


def test_a_delayed_event_fired_from_a_coroutine_waits_on_the_ladder(worker, producer, records):
    worker("orders")  # its worker declares the delay ladder

    async def fire() -> str:
        fired = await producer.fire_async("test.ping", ["later"], {}, countdown=2)
        await producer.close_async()
        return fired

    fired = asyncio.run(fire())
    [record] = records.wait(1)
    assert record["id"] == fired
    assert_broker_waited(record["time"] - datetime.fromisoformat(record["fired_at"]).timestamp(), 2)  # never early


def test_a_delayed_event_without_a_ladder_is_an_error(producer):
    async def fire() -> None:
        try:
            await producer.fire_async("test.ping", ["later"], {}, countdown=2)
        finally:
            await producer.close_async()

    with pytest.raises(TopologyMissing, match="delay ladder"):
        asyncio.run(fire())


def test_a_broker_that_cannot_be_reached_raises_publish_error_without_blocking_the_loop(caplog):
    app = events_app(
        "orders", broker_url=f"amqp://guest:guest@127.0.0.1:{free_port()}//", amqp_events_publish_timeout=1
    )
    ticks: list[int] = []

    async def tick() -> None:
        while True:
            ticks.append(1)
            await asyncio.sleep(0.01)

    async def fire() -> None:
        ticking = asyncio.create_task(tick())
        try:
            with pytest.raises(PublishError, match="within 1s: broker unavailable") as raised:
                await app.fire_async("billing.invoice.paid", [], {"invoice_id": 1})
            assert len(raised.value.event_ids) == 1
        finally:
            ticking.cancel()

    with caplog.at_level(logging.WARNING, "amqp_events"):
        asyncio.run(fire())
    assert len(ticks) > 1  # other coroutines ran while the publish waited for the broker
    app.close()


def test_an_async_session_s_outbox_publishes_what_its_transaction_committed_and_nothing_else(
    postgres_url, broker_url, worker, producer, records
):
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    worker("orders")
    app = events_app("shop", broker_url=broker_url, amqp_events_outbox_relay=True)
    app.outbox_store(postgres_url).create()

    async def write() -> str:
        engine = create_async_engine(postgres_url)  # psycopg 3, on the event loop
        try:
            async with AsyncSession(engine) as session:
                async with session.begin(), app.outbox_async(session):
                    kept = await app.fire_async("test.ping", ["committed"], {})
                    app.fire("test.ping", ["committed too"], {})  # a plain fire in the block is a row too
                with pytest.raises(RuntimeError, match="business"):
                    async with session.begin(), app.outbox_async(session):
                        await app.fire_async("test.ping", ["rolled back"], {})
                        raise RuntimeError("the business write failed")
            return kept
        finally:
            await engine.dispose()

    try:
        kept = asyncio.run(write())
        seen = records.wait(2, timeout=30)  # published by the relay thread once the transaction committed
        assert kept in {record["id"] for record in seen}
        records.barrier(producer, ("orders",))
        assert sorted(record["tag"] for record in records.all()) == ["committed", "committed too"]
    finally:
        app.close()


def test_a_message_fired_from_a_coroutine_is_the_one_fired_blocking(producer, broker_url):
    """Both publishers write the same properties: persistent, the event's id, the channel's user (which the broker
    verifies), JSON; nothing else (no priority)."""
    exchange = Exchange("events", "topic", durable=True)
    with Connection(broker_url) as connection:
        queue = Queue(
            f"wire-{uuid.uuid4().hex}", exchange, "test.ping", exclusive=True, channel=connection.default_channel
        )
        queue.declare()

        async def fire_async() -> str:
            event_id = await producer.fire_async("test.ping", [], {"tag": "t"}, event_id="from-a-coroutine")
            await producer.close_async()
            return event_id

        fired = {"blocking": producer.fire("test.ping", [], {"tag": "t"}, event_id="blocking"),
                 "coroutine": asyncio.run(fire_async())}  # fmt: skip
        taken = {}
        for _ in fired:
            message = wait_for(lambda: queue.get(no_ack=True), 10, what="a fired event")
            taken[message.properties["message_id"]] = message
    blocking, coroutine = taken[fired["blocking"]], taken[fired["coroutine"]]
    assert coroutine.properties.keys() == blocking.properties.keys()
    assert "priority" not in coroutine.properties
    for name in ("delivery_mode", "user_id", "content_type", "content_encoding"):
        assert coroutine.properties[name] == blocking.properties[name], name
    assert coroutine.properties["delivery_mode"] == 2 and coroutine.properties["user_id"] == "guest"
    assert coroutine.headers.keys() == blocking.headers.keys() and coroutine.body == blocking.body
