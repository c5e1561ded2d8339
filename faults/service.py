"""The service every fault-suite worker runs (``SERVICE`` picks alpha, beta or gamma).

Each handler notes every run in ``$JOURNAL`` before it returns or raises;
20% of runs fail at random (retried on the broker), and the events marked
poison always fail: ``retry`` ones until their retries run out,
``permanent`` ones at once.

With ``INBOX_DB`` (inbox mode) each handler's effect is a row of the
``effects`` table of that PostgreSQL database, written through the inbox:
the row is written first, then the run fails or not, so that a failure
rolls the row back with the inbox key.
"""

import json
import os
import random
import time

from sqlalchemy import create_engine, insert

from amqp_events import PermanentFailure, current_event
from amqp_events.celery import events_app
from faults.effects import effects

SERVICE = os.environ["SERVICE"]

app = events_app(
    SERVICE,
    broker_url=os.environ["BROKER_URL"],
    # Enough retries that 20% random failures never exhaust them (0.2**11), with short waits.
    amqp_events_max_retries=10,
    amqp_events_backoff_base=1,
    amqp_events_backoff_max=2,
    amqp_events_heartbeat_interval=2,
)


def inbox_of(url: str | None):  # type: ignore[no-untyped-def]
    if not url:
        return None
    from amqp_events.inbox import Inbox

    return Inbox(create_engine(url, pool_size=2))


INBOX = inbox_of(os.environ.get("INBOX_DB"))


class Flaky(RuntimeError):
    """A transient failure."""


def note(seq: int, outcome: str) -> None:
    event = current_event()
    line = {"service": SERVICE, "seq": seq, "outcome": outcome, "id": event.id, "attempt": event.attempt}
    with open(os.environ["JOURNAL"], "a") as journal:  # one O_APPEND write per line
        journal.write(json.dumps({**line, "pid": os.getpid(), "time": time.time()}) + "\n")


def handle(seq: int, poison: str = "", connection=None) -> None:  # type: ignore[no-untyped-def]
    if connection is not None:
        connection.execute(insert(effects).values(service=SERVICE, seq=seq, event_id=current_event().id))
    if poison == "permanent":
        note(seq, "failed")
        raise PermanentFailure(f"event {seq} can never succeed")
    if poison == "retry" or random.random() < 0.2:
        note(seq, "failed")
        raise Flaky(f"event {seq} failed")
    note(seq, "ok")


def register(event: str) -> None:
    """The handler of ``event``: plain, or taking the inbox's connection first in inbox mode."""
    if INBOX is None:

        def on_event(seq: int, poison: str = "") -> None:
            handle(seq, poison)

    else:

        def on_event(connection, seq: int, poison: str = "") -> None:  # type: ignore[no-untyped-def]
            handle(seq, poison, connection)

    on_event.__name__ = on_event.__qualname__ = f"on_{event.rsplit('.', 1)[-1]}"
    app.handler(event, inbox=INBOX)(on_event)


for kind in ("fault.a", "fault.b", "fault.c"):
    register(kind)
