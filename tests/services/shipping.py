"""The ``shipping`` test service: also handles ``test.ping``, so it sees every ping ``orders`` sees."""

import os

from amqp_events.celery import events_app
from services.behaviour import behave, maybe_coroutine

app = events_app(
    "shipping",
    broker_url=os.environ["BROKER_URL"],
    amqp_events_history=os.environ.get("HISTORY") == "1",
    amqp_events_shared_queue_max_bytes=int(os.environ.get("SHARED_QUEUE_MAX_BYTES", 1024**3)),
)


@app.handler("test.ping", bind=True)
@maybe_coroutine
def on_ping(self, tag, how=None):
    behave(self, "shipping", tag, how)
