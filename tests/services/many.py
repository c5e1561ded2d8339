"""The ``many`` test service: 40 handlers, one per event ``many.e<n>``; each waits (60 s at most) while the file
``$HOLD_FILE`` exists, so that what the worker took stays unacked."""

import os
import time
from pathlib import Path

from amqp_events.celery import events_app
from services.behaviour import record

app = events_app(
    "many",
    broker_url=os.environ["BROKER_URL"],
    amqp_events_worker_prefetch_limit=int(os.environ.get("PREFETCH_LIMIT", "256")),
)
HOLD = Path(os.environ.get("HOLD_FILE", "/nonexistent"))
EVENTS = [f"many.e{n}" for n in range(40)]


def handler_of(event: str):
    def handle(n: int) -> None:
        deadline = time.monotonic() + 60
        while HOLD.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # the test's flag file has no event to wait on
        record("many", tag=f"{event}:{n}")

    handle.__name__ = handle.__qualname__ = f"on_{event.replace('.', '_')}"
    return handle


for name in EVENTS:
    app.handler(name)(handler_of(name))
