"""A Django project in one file, for the outbox's Django adapter: ``python django_shop.py POSTGRES_URL``.

Migrates (the library's migration creates the outbox), then fires one event in a transaction that rolls
back and one in a transaction that commits; prints both ids.
"""

import os
import sys
from urllib.parse import urlsplit

import django
from django.conf import settings

url = urlsplit(sys.argv[1])
settings.configure(
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": url.path.lstrip("/"),
            "USER": url.username,
            "HOST": url.hostname,
            "PORT": url.port,
        }
    },
    INSTALLED_APPS=["amqp_events.django"],
    USE_TZ=True,
)
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from amqp_events.celery import events_app  # noqa: E402

call_command("migrate", verbosity=0)
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE IF NOT EXISTS invoices (id integer PRIMARY KEY)")

app = events_app("shop", broker_url=os.environ["BROKER_URL"])


class Declined(Exception):
    pass


try:
    with transaction.atomic(), app.outbox(connection):
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO invoices VALUES (1)")
        rolled_back = app.fire("test.ping", ["rolled back"], {})
        raise Declined
except Declined:
    pass
with transaction.atomic(), app.outbox(connection):
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO invoices VALUES (2)")
    committed = app.fire("test.ping", ["committed"], {})
print(rolled_back, committed)
