"""The ``orders`` test service."""

import json
import os

from amqp_events import Reason
from amqp_events.celery import events_app
from amqp_events.core.context import Middleware
from amqp_events.errors import Refused
from services import catalog
from services.behaviour import behave, in_sections, maybe_coroutine, record

app = events_app(
    "orders",
    broker_url=os.environ["BROKER_URL"],
    amqp_events_max_retries=int(os.environ.get("MAX_RETRIES", "3")),
    amqp_events_backoff_max=float(os.environ.get("BACKOFF_MAX", "3600")),
    amqp_events_heartbeat_interval=float(os.environ.get("HEARTBEAT_INTERVAL", "5")),
    amqp_events_max_redeliveries=int(os.environ.get("MAX_REDELIVERIES", "10")),
    amqp_events_publish_timeout=float(os.environ.get("PUBLISH_TIMEOUT", "10")),
    amqp_events_history=os.environ.get("HISTORY") == "1",
    amqp_events_health_stall=float(os.environ.get("HEALTH_STALL", "60")),
    amqp_events_max_body_bytes=int(os.environ.get("MAX_BODY_BYTES", 16 * 1024 * 1024)),
    amqp_events_shared_queue_max_bytes=int(os.environ.get("SHARED_QUEUE_MAX_BYTES", 1024**3)),
    task_soft_time_limit=float(os.environ["TIME_LIMIT"]) if os.environ.get("TIME_LIMIT") else None,
)


class RefusesATag(Middleware):
    """Reads every message before anything decodes it, and refuses those of ``$REFUSE_TAG`` (a test's
    ``before_receive`` hook)."""

    def before_receive(self, context, received):
        if json.loads(received.body)[0][:1] == [os.environ["REFUSE_TAG"]]:
            raise Refused(Reason.UNDECODABLE, f"tag {os.environ['REFUSE_TAG']!r} is refused")
        return received


if os.environ.get("REFUSE_TAG"):
    app.add_middleware(RefusesATag())

UserRegistered = app.event("users.registered")(catalog.UserRegistered)
UserRegisteredModel = app.event("users.registered_model")(catalog.UserRegisteredModel)


@app.handler("test.ping", bind=True)
@maybe_coroutine
def on_ping(self, tag, how=None):
    behave(self, "orders", tag, how)


@app.handler("test.orders_only", bind=True, max_retries=int(os.environ.get("HANDLER_MAX_RETRIES", "1")))
@maybe_coroutine
def on_orders_only(self, tag, how=None):
    behave(self, "orders", tag, how)


@app.handler("test.sections", max_retries=1)
@maybe_coroutine
def on_sections(tag, fail):
    in_sections("orders", tag, fail)


@app.handler("billing.invoice.paid")
@maybe_coroutine
def on_invoice_paid(invoice_id: int, amount: str):
    record("orders", tag=f"invoice-{invoice_id}", amount=amount)


@app.handler(UserRegistered)
@maybe_coroutine
def on_user_registered(event: UserRegistered):
    record("orders", tag=f"user-{event.user_id}", email=event.email, type=type(event).__name__)


@app.handler(UserRegisteredModel)
@maybe_coroutine
def on_user_registered_model(event: UserRegisteredModel):
    record("orders", tag=f"user-{event.user_id}", email=event.email, type=type(event).__name__)
