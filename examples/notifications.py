"""The notifications service e-mails a receipt, once the payment is at least a few seconds old."""

import os
from datetime import datetime, timedelta, timezone

from journal import note

from amqp_events import current_event
from amqp_events.celery import events_app

app = events_app("notifications", broker_url=os.environ.get("BROKER_URL", "amqp://guest:guest@localhost:5672/"))


@app.handler("billing.invoice.paid", bind=True)
def email_receipt(self, invoice_id: int, amount: str, customer: str):
    # Wait on the broker (not in this worker) until the payment had time to settle.
    age = datetime.now(timezone.utc) - current_event().fired_at
    if invoice_id % 10 == 0 and age < timedelta(seconds=2):
        note("notifications", "postponed", invoice=invoice_id)
        raise self.retry(countdown=2)
    note("notifications", "handled", invoice=invoice_id)
