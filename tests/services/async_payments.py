"""The ``async_payments`` test service: coroutine handlers whose effect must happen once per event, in an
``AsyncSession`` (PostgreSQL through psycopg's async driver, ``DATABASE_URL``) or with a ``redis.asyncio``
dedup store (``REDIS_URL``)."""

import asyncio
import os

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from amqp_events import current_event
from amqp_events.celery import events_app
from amqp_events.inbox import Inbox, RedisDedup
from services.behaviour import Flaky, record
from services.effects import effects

app = events_app("async_payments", broker_url=os.environ["BROKER_URL"], amqp_events_max_retries=3)
engine = create_async_engine(os.environ["DATABASE_URL"])


@app.handler("pay.async", inbox=Inbox(async_sessionmaker(engine)))
async def on_pay(session, tag: str, how: dict | None = None) -> None:
    """Write the effect, then behave as the payload says (a failure after the write rolls both back)."""
    how = how or {}
    await session.execute(insert(effects).values(event_id=current_event().id, tag=tag, pid=os.getpid()))
    record("async_payments", tag=tag)
    await asyncio.sleep(how.get("sleep", 0))  # holds the key's row lock: a twin waits, the loop does not
    if current_event().attempt <= how.get("fail_times", 0):
        raise Flaky(f"{tag} failed after its write")


if os.environ.get("REDIS_URL"):
    import redis.asyncio

    @app.handler("mail.async", dedup=RedisDedup(redis.asyncio.Redis.from_url(os.environ["REDIS_URL"])))
    async def on_mail(tag: str) -> None:
        record("async_payments", tag=tag)
