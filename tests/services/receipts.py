"""The ``receipts`` test service, before and after ``billing.invoice.settled`` gained a ``currency``: with
``RECEIPTS_VERSION=1`` its handler takes version 1 (``invoice_id``, ``amount``); otherwise version 2, with an upcaster
that gives a version-1 event the currency it always was."""

import os

from amqp_events.celery import events_app
from services.behaviour import record

app = events_app("receipts", broker_url=os.environ["BROKER_URL"])

if os.environ.get("RECEIPTS_VERSION") == "1":

    @app.handler("billing.invoice.settled")
    def on_settled(invoice_id: int, amount: str) -> None:
        record("receipts", invoice_id=invoice_id, amount=amount, currency=None)

else:

    @app.handler("billing.invoice.settled", upcasters={1: lambda arguments: {**arguments, "currency": "EUR"}})
    def on_settled(invoice_id: int, amount: str, currency: str) -> None:
        record("receipts", invoice_id=invoice_id, amount=amount, currency=currency)
