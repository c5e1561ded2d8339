"""celery-amqp-events 0.1.0 (run in its own virtualenv): the original design, as a baseline."""

import os

from amqp_events.celery import events_app
from marks import mark

app = events_app("legacy", broker_url=os.environ["BROKER_URL"])


@app.event("bench.noop")
def noop_event(n, last=False):
    pass


@app.handler("bench.noop")
def noop(n, last=False):
    mark(n, last)
