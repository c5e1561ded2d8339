"""A service with 50 handlers (``fleet.e00`` ... ``fleet.e49``) for the queue-layout benchmarks (bench/fleet.py).

Every handler marks every event (``MARK_ALL``) with the time it was fired; ``fleet.e00`` takes ``SLOW_MS``
milliseconds when it is set (a slow handler beside 49 fast ones)."""

import json
import os
import time

from amqp_events.celery import events_app

HANDLERS = 50
SLOW = float(os.environ.get("SLOW_MS") or 0) / 1000
MARKS = os.environ["MARKS_FILE"]

app = events_app(os.environ.get("SERVICE", "fleet"), broker_url=os.environ["BROKER_URL"])


def handler_of(index: int):
    def handle(n, fired_at, last=False):
        if SLOW and index == 0:
            time.sleep(SLOW)
        with open(MARKS, "a") as out:
            out.write(json.dumps({"n": n, "handler": index, "fired_at": fired_at, "time": time.time(), "last": last}))
            out.write("\n")

    handle.__name__ = handle.__qualname__ = f"handle_{index:02d}"
    return handle


for index in range(HANDLERS):
    app.handler(f"fleet.e{index:02d}")(handler_of(index))
