"""The billing service: it fires ``billing.invoice.paid`` and handles nothing."""

import os
from decimal import Decimal, InvalidOperation

from amqp_events.celery import events_app

app = events_app("billing", broker_url=os.environ.get("BROKER_URL", "amqp://guest:guest@localhost:5672/"))


@app.event("billing.invoice.paid")
def invoice_paid(invoice_id: int, amount: str, customer: str):
    """An invoice was paid in full. The body validates; nothing is published if it raises."""
    try:
        if Decimal(amount) <= 0:
            raise ValueError(f"invoice {invoice_id}: amount must be positive, got {amount}")
    except InvalidOperation:
        raise ValueError(f"invoice {invoice_id}: amount {amount!r} is not a number") from None
