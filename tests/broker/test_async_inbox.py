"""Exactly-once effects of coroutine handlers: the inbox in an ``AsyncSession`` (PostgreSQL) and a
``redis.asyncio`` dedup store, with real workers running many coroutines at once."""

from __future__ import annotations

import pytest
from helpers import effect_count, effects_tables, publish_twice

from amqp_events import events_app
from amqp_events.inbox import Inbox
from amqp_events.testing import wait_for


@pytest.fixture
def effects_db(postgres_url):
    with effects_tables(postgres_url) as engine:
        yield engine


def test_twins_at_once_make_one_effect_and_a_failure_after_the_write_leaves_nothing(
    worker, producer, postgres_url, effects_db, records
):
    """Each twin waits on the other's uncommitted key in the database while the worker's loop runs the rest."""
    process = worker("async_payments", env={"DATABASE_URL": postgres_url})
    twins = [publish_twice(producer, "pay.async", f"twin{n}", {"sleep": 0.5}) for n in range(8)]
    flaky = producer.fire("pay.async", ["flaky"], {"how": {"fail_times": 1}})
    wait_for(lambda: process.log().count("duplicate skipped") == 8, 60, what="each twin skipped")
    assert [run["attempt"] for run in records.wait(2, id=flaky)] == [1, 2]  # the first run's write rolled back
    # A run is recorded from inside the handler: its transaction commits after.
    wait_for(lambda: effect_count(effects_db, event_id=flaky) >= 1, 30, what="the retried run's effect committed")
    for event_id in [*twins, flaky]:
        assert effect_count(effects_db, event_id=event_id) == 1
    assert effect_count(effects_db) == 9


def test_a_redis_asyncio_dedup_store_skips_a_duplicate(worker, producer, postgres_url, redis_url, records):
    process = worker("async_payments", env={"DATABASE_URL": postgres_url, "REDIS_URL": redis_url})
    message = producer.event_message("mail.async", ["once"], {})
    producer.transport.publish(message)
    records.wait(1, id=message.message_id)
    producer.transport.publish(message)
    wait_for(lambda: "duplicate skipped" in process.log(), 30, what="the duplicate skipped")
    assert len(records.all(id=message.message_id)) == 1


def test_an_inbox_must_fit_the_handler(postgres_url):
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import create_async_engine

    app = events_app("fitting", broker_url="amqp://localhost//")
    with pytest.raises(TypeError, match="coroutine handler: its inbox must hand it an async session"):

        @app.handler("a.b", inbox=Inbox(create_engine(postgres_url)))
        async def blocking(connection): ...

    with pytest.raises(TypeError, match="write it as a coroutine"):

        @app.handler("a.c", inbox=Inbox(create_async_engine(postgres_url)))
        def plain(connection): ...
