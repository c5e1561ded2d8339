"""A Django project in one file, for the outbox's Django adapter: ``python django_shop.py POSTGRES_URL``.

Migrates (the library's migration creates the outbox), then fires one event in a transaction that rolls
back and one in a transaction that commits; prints both ids.
"""

import os
import sys

from django_settings import configure  # run as a script: its directory is on sys.path

configure(sys.argv[1])

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
