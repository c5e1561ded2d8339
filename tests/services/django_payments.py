"""The ``djpayments`` test service: a Django project whose handler writes through Django, once per event.

``DATABASE_URL`` (PostgreSQL) is Django's default database; its migrations make the inbox table.
"""

import os

from services.django_settings import configure

configure(os.environ["DATABASE_URL"])

from amqp_events import current_event  # noqa: E402
from amqp_events.celery import events_app  # noqa: E402
from amqp_events.django import DjangoInbox  # noqa: E402
from services.behaviour import Flaky, record  # noqa: E402

app = events_app("djpayments", broker_url=os.environ["BROKER_URL"], amqp_events_max_retries=3)


@app.handler("pay.django", inbox=DjangoInbox())
def on_pay(connection, tag: str, how: dict | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO effects (event_id, tag, pid) VALUES (%s, %s, %s)", [current_event().id, tag, os.getpid()]
        )
    record("djpayments", tag=tag)
    if current_event().attempt <= (how or {}).get("fail_times", 0):
        raise Flaky(f"{tag} failed after its write")
