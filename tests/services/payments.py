"""The ``payments`` test service: handlers whose effect must happen once per event.

``DATABASE_URL`` names the database of the effects and of the inbox; ``REDIS_URL`` (optional) a Redis for
the dedup store. Every run is recorded (``RECORD_FILE``), rolled back or not; every committed effect is a row
of the ``effects`` table.
"""

import os
import time

from sqlalchemy import create_engine, insert
from sqlalchemy.orm import sessionmaker

from amqp_events import current_event
from amqp_events.celery import events_app
from amqp_events.inbox import Inbox, RedisDedup, SqlDedup
from services.behaviour import Flaky, record
from services.effects import effects

app = events_app(
    "payments",
    broker_url=os.environ["BROKER_URL"],
    amqp_events_max_retries=3,
    amqp_events_backoff_max=2.0,
    amqp_events_inbox_prune_interval=float(os.environ.get("PRUNE_INTERVAL", "600")),
    amqp_events_inbox_retention=float(os.environ.get("INBOX_RETENTION", str(14 * 86400))),
)
engine = create_engine(os.environ["DATABASE_URL"])


def effect(handle, tag: str, how: dict | None) -> None:
    """Write the effect, then behave as the payload says (a failure after the write rolls both back)."""
    how = {} if os.environ.get("FIXED") else how or {}
    handle.execute(insert(effects).values(event_id=current_event().id, tag=tag, pid=os.getpid()))
    record("payments", tag=tag)
    if how.get("sleep"):
        time.sleep(how["sleep"])  # holds the inbox key's lock: a twin waits for the commit
    if current_event().attempt <= how.get("fail_times", 0):
        raise Flaky(f"{tag} failed after its write")
    if how.get("permanent"):
        from amqp_events import PermanentFailure

        raise PermanentFailure(f"{tag} can never succeed")


@app.handler("pay.session", inbox=Inbox(sessionmaker(engine)))
def on_pay_with_a_session(session, tag: str, how: dict | None = None) -> None:
    effect(session, tag, how)


@app.handler("pay.connection", inbox=Inbox(engine))
def on_pay_with_a_connection(connection, tag: str, how: dict | None = None) -> None:
    effect(connection, tag, how)


if os.environ.get("REDIS_URL"):
    import redis

    # A TTL of 5 s: the twin, right behind the first copy, is handled well within it.
    @app.handler("mail.redis", dedup=RedisDedup(redis.Redis.from_url(os.environ["REDIS_URL"]), ttl=5))
    def on_mail_with_redis(tag: str, how: dict | None = None) -> None:
        record("payments", tag=tag)


@app.handler("mail.sql", dedup=SqlDedup(engine))
def on_mail_with_sql(tag: str, how: dict | None = None) -> None:
    record("payments", tag=tag)
