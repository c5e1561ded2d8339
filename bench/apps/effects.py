"""A service whose handler's effect is a PostgreSQL insert: alone, through the inbox, or with a Redis dedup store.

``EFFECT_MODE``: ``plain`` (the handler opens its own transaction), ``inbox`` or ``redis``; ``DATABASE_URL``
and ``REDIS_URL`` name the stores.
"""

import os

from marks import mark
from sqlalchemy import Column, Integer, MetaData, Table, create_engine, insert

from amqp_events.celery import events_app
from amqp_events.inbox import Inbox, RedisDedup

app = events_app(os.environ.get("SERVICE", "bench"), broker_url=os.environ["BROKER_URL"])
engine = create_engine(os.environ["DATABASE_URL"], pool_size=1)
# Created by the benchmark: CREATE TABLE effects (id SERIAL PRIMARY KEY, n INTEGER)
effects = Table("effects", MetaData(), Column("id", Integer, primary_key=True), Column("n", Integer))
MODE = os.environ["EFFECT_MODE"]

if MODE == "inbox":

    @app.handler("bench.effect", inbox=Inbox(engine))
    def effect_once(connection, n: int, last: bool = False) -> None:
        connection.execute(insert(effects).values(n=n))
        mark(n, last)

else:
    import redis

    dedup = RedisDedup(redis.Redis.from_url(os.environ["REDIS_URL"])) if MODE == "redis" else None

    @app.handler("bench.effect", dedup=dedup)
    def effect(n: int, last: bool = False) -> None:
        with engine.begin() as connection:
            connection.execute(insert(effects).values(n=n))
        mark(n, last)
