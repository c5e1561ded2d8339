"""The service of the flow-control benchmarks (bench/flow_control.py): handlers under limits read from the
environment, each run marked as it starts and as it ends."""

import json
import os
import time

from amqp_events.celery import events_app

app = events_app(os.environ.get("SERVICE", "bench"), broker_url=os.environ["BROKER_URL"])
MARKS = os.environ.get("MARKS_FILE")
#: Seconds a run takes.
RUN = float(os.environ.get("RUN_SECONDS") or 0)
#: Mark only the first and the last event (a drain's rate), not every run.
ENDS_ONLY = bool(os.environ.get("MARK_ENDS_ONLY"))


def mark(handler, n, tag, last=False, **fields):
    if MARKS and (not ENDS_ONLY or n == 0 or last):
        with open(MARKS, "a") as out:
            line = {"handler": handler, "n": n, "tag": tag, "last": last, "time": time.time(), "pid": os.getpid()}
            line.update(fields)
            out.write(json.dumps(line) + "\n")


def limit(name):
    """A limit from the environment (``RATE``, ``CONCURRENCY``); unset: none, as a handler without the option."""
    value = os.environ.get(name)
    return None if not value else int(value) if name == "CONCURRENCY" else value


@app.handler("bench.limited", rate_limit=limit("RATE"), concurrency=limit("CONCURRENCY"))
def limited(n, last=False):
    mark("limited", n, "start", last)
    if RUN:
        time.sleep(RUN)
        mark("limited", n, "end")


@app.handler("bench.per_key", concurrency=1, concurrency_key="key")
def per_key(n, key):
    mark("per_key", n, "start", key=key)
    time.sleep(RUN)
    mark("per_key", n, "end", key=key)


@app.handler("bench.per_key_rate", rate_limit=os.environ.get("KEY_RATE") or "600/m", rate_limit_key="key")
def per_key_rate(n, key):
    mark("per_key_rate", n, "start", key=key)
