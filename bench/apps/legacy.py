"""celery-amqp-events 0.1.0 (run in its own virtualenv): the original design's worker, as a baseline."""

import os

from marks import mark

from amqp_events.celery import events_app

app = events_app("legacy", broker_url=os.environ["BROKER_URL"])


@app.handler("bench.noop")
def noop(n, last=False):
    mark(n, last)
