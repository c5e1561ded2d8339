"""Django support (the ``[django]`` extra): the outbox and the inbox in Django's own transactions.

Add ``"amqp_events.django"`` to ``INSTALLED_APPS``: its migrations create the
outbox tables (``amqp_events_outbox``, or the Django setting
``AMQP_EVENTS_OUTBOX_TABLE``) and the inbox table (``amqp_events_inbox``, or
``AMQP_EVENTS_INBOX_TABLE``) with the same definitions as ``amqp-events
outbox init`` and ``inbox init``. Then fire inside ``app.outbox(connection)``::

    from django.db import connection, transaction

    with transaction.atomic(), app.outbox(connection):
        Invoice.objects.create(...)
        invoice_paid(invoice.id, invoice.amount)

The row is written on Django's connection, in the ``atomic()`` block's
transaction; the in-process relay (``amqp_events_outbox_relay``) is woken by
``transaction.on_commit``. A handler whose writes must happen once takes
``inbox=DjangoInbox()``: it runs in ``transaction.atomic()`` with the event's
key inserted first, and receives the connection as its first argument.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from amqp_events.inbox.base import EffectKey
from amqp_events.outbox.schema import DEFAULT_TABLE, OutboxTables, outbox_tables


def django_tables() -> OutboxTables:
    from django.conf import settings

    return outbox_tables(getattr(settings, "AMQP_EVENTS_OUTBOX_TABLE", DEFAULT_TABLE))


def inbox_table_name() -> str:
    from django.conf import settings

    return str(getattr(settings, "AMQP_EVENTS_INBOX_TABLE", "amqp_events_inbox"))


class DjangoInbox:
    """``@app.handler(..., inbox=DjangoInbox())``: exactly-once effects in Django's database ``using``."""

    def __init__(self, using: str = "default", table: str | None = None) -> None:
        self.using, self._table = using, table

    def _quoted_table(self, connection: Any) -> str:
        return str(connection.ops.quote_name(self._table or inbox_table_name()))

    @contextmanager
    def transaction(self, key: EffectKey) -> Iterator[tuple[Any, bool]]:
        from django.db import connections, transaction

        connection = connections[self.using]
        with transaction.atomic(using=self.using):
            with connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {self._quoted_table(connection)} (service, handler, event_id, processed_at) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    [key.service, key.handler, key.event_id, time.time()],
                )
                first_time = cursor.rowcount == 1
            yield connection, first_time

    def prune(self, older_than: float, batch: int = 1000) -> int:
        from django.db import connections, transaction

        connection = connections[self.using]
        table = self._quoted_table(connection)
        pruned = 0
        while True:
            with transaction.atomic(using=self.using), connection.cursor() as cursor:
                cursor.execute(
                    f"DELETE FROM {table} WHERE (service, handler, event_id) IN "
                    f"(SELECT service, handler, event_id FROM {table} WHERE processed_at < %s LIMIT %s)",
                    [older_than, batch],
                )
                deleted = int(cursor.rowcount)
            pruned += deleted
            if deleted < batch:
                return pruned
