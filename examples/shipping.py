"""The shipping service books a courier. It cannot ship to a customer without an address: that goes to its archive."""

import os

from journal import note

from amqp_events import PermanentFailure
from amqp_events.celery import events_app

app = events_app("shipping", broker_url=os.environ.get("BROKER_URL", "amqp://guest:guest@localhost:5672/"))

ADDRESSES = {"ada": "12 Analytical Row", "grace": "1 Compiler Court", "linus": "4 Kernel Street"}


@app.handler("billing.invoice.paid")
def book_courier(invoice_id: int, amount: str, customer: str):
    if customer not in ADDRESSES:
        note("shipping", "archived", invoice=invoice_id)
        raise PermanentFailure(f"no shipping address for customer {customer!r}")
    note("shipping", "handled", invoice=invoice_id, address=ADDRESSES[customer])
