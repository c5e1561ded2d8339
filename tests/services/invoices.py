"""The ``invoices`` test service: it takes ``billing.invoice.paid`` at version 2 (``total`` and ``currency``), and an
event fired at version 1 (``amount``) reaches it through its upcaster. With ``BROKEN_UPCASTER=1`` the upcaster fails
until the fix is deployed (``FIXED=1``), so that what it archived can be replayed through it; ``NO_UPCASTER=1`` is
the release that forgot it."""

import os

from amqp_events.celery import events_app
from services.behaviour import record

app = events_app("invoices", broker_url=os.environ["BROKER_URL"], amqp_events_history=os.environ.get("HISTORY") == "1")


def v1_to_v2(arguments: dict) -> dict:
    if os.environ.get("BROKEN_UPCASTER") == "1" and os.environ.get("FIXED") != "1":
        raise LookupError("the upcaster's bug, fixed in the next deploy")
    return {"invoice_id": arguments["invoice_id"], "total": arguments["amount"], "currency": "EUR"}


@app.handler("billing.invoice.paid", upcasters=None if os.environ.get("NO_UPCASTER") == "1" else {1: v1_to_v2})
def on_paid(invoice_id: int, total: str, currency: str) -> None:
    record("invoices", invoice_id=invoice_id, total=total, currency=currency)
