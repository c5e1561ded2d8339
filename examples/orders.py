"""The orders service marks orders paid. Its database is flaky: about one call in six fails and is retried."""

import os
import random

from journal import note

from amqp_events.celery import events_app

app = events_app("orders", broker_url=os.environ.get("BROKER_URL", "amqp://guest:guest@localhost:5672/"))


class DatabaseTimeout(Exception):
    pass


@app.handler("billing.invoice.paid")
def mark_order_paid(invoice_id: int, amount: str, customer: str):
    if random.random() < 1 / 6:
        note("orders", "failed", invoice=invoice_id)
        raise DatabaseTimeout(f"orders db timed out while marking invoice {invoice_id} paid")
    note("orders", "handled", invoice=invoice_id)
