"""The services of the in-process benchmark: ``billing`` fires, ``shipping`` fails on every third invoice."""

import os

from marks import mark

from amqp_events.celery import events_app

URL = os.environ.get("BROKER_URL", "amqp://in-process.invalid//")
billing = events_app("billing", broker_url=URL)
app = shipping = events_app("shipping", broker_url=URL, amqp_events_max_retries=2)


@billing.event("billing.invoice.paid")
def invoice_paid(invoice_id: int, amount: str):
    if not amount:
        raise ValueError("amount required")


@shipping.handler("billing.invoice.paid")
def book_courier(invoice_id: int, amount: str):
    if invoice_id % 3 == 0:
        raise ConnectionError("carrier down")
    mark(invoice_id, False, attempt=1)
