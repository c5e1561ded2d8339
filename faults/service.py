"""The service every fault-suite worker runs (``SERVICE`` picks alpha, beta or gamma).

Each handler notes every run in ``$JOURNAL`` before it returns or raises;
20% of runs fail at random (retried on the broker), and the events marked
poison always fail: ``retry`` ones until their retries run out,
``permanent`` ones at once.
"""

import json
import os
import random
import time

from amqp_events import PermanentFailure, current_event
from amqp_events.celery import events_app

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


class Flaky(RuntimeError):
    """A transient failure."""


def note(seq: int, outcome: str) -> None:
    event = current_event()
    line = {"service": SERVICE, "seq": seq, "outcome": outcome, "id": event.id, "attempt": event.attempt}
    with open(os.environ["JOURNAL"], "a") as journal:  # one O_APPEND write per line
        journal.write(json.dumps({**line, "pid": os.getpid(), "time": time.time()}) + "\n")


def handle(seq: int, poison: str = "") -> None:
    if poison == "permanent":
        note(seq, "failed")
        raise PermanentFailure(f"event {seq} can never succeed")
    if poison == "retry" or random.random() < 0.2:
        note(seq, "failed")
        raise Flaky(f"event {seq} failed")
    note(seq, "ok")


@app.handler("fault.a")
def on_a(seq: int, poison: str = "") -> None:
    handle(seq, poison)


@app.handler("fault.b")
def on_b(seq: int, poison: str = "") -> None:
    handle(seq, poison)


@app.handler("fault.c")
def on_c(seq: int, poison: str = "") -> None:
    handle(seq, poison)
