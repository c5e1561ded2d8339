"""The ``accounts`` test service: two handlers of ``test.ping``, the event's own and one named ``audit``
(recorded as ``accounts`` and ``accounts.audit``)."""

import os

from amqp_events.celery import events_app
from services.behaviour import behave, maybe_coroutine

app = events_app(
    "accounts",
    broker_url=os.environ["BROKER_URL"],
    amqp_events_max_retries=2,
    amqp_events_paused_wait=int(os.environ.get("PAUSED_WAIT", "30")),
    amqp_events_history=os.environ.get("HISTORY") == "1",
)


@app.handler("test.ping", bind=True)
@maybe_coroutine
def on_ping(self, tag, how=None):
    behave(self, "accounts", tag, how)


@app.handler("test.ping", name="audit", bind=True)
@maybe_coroutine
def audit_ping(self, tag, how=None):
    behave(self, "accounts.audit", tag, how)
