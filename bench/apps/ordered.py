"""The service of the ordering benchmark: the same no-op handler, ordered by a key and not."""

import os

from marks import mark

from amqp_events.celery import events_app

app = events_app(os.environ.get("SERVICE", "bench"), broker_url=os.environ["BROKER_URL"])


@app.handler("bench.ordered", ordered_by="key")
def ordered(n, key, last=False):
    mark(n, last)


@app.handler("bench.unordered")
def unordered(n, key, last=False):
    mark(n, last)
