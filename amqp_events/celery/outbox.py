"""An app's transactional outbox (``app.outbox(...)``, ``app.outbox_store()``): its tables, its store on a
database, and its in-process relay thread (``amqp_events_outbox_relay``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from amqp_events.core.firing import sending_to
from amqp_events.outbox.relay import RelayThread
from amqp_events.outbox.schema import OutboxTables, outbox_tables
from amqp_events.outbox.store import OutboxStore
from amqp_events.outbox.writer import OutboxWriter, target_of

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from amqp_events.celery.app import EventsApp


class OutboxFacade:
    def __init__(self, app: EventsApp) -> None:
        self.app = app

    @contextmanager
    def writing(self, transaction: Any) -> Iterator[OutboxWriter]:
        """Inside the block, what the app fires is written on ``transaction`` (see ``EventsApp.outbox``)."""
        in_process = self.app._stand_in is not None  # the in-process mode relays when the test asks it to
        writer = OutboxWriter(self.app.service, target_of(transaction, self.tables), None if in_process else self.relay)
        with sending_to(writer):
            yield writer

    @cached_property
    def tables(self) -> OutboxTables:
        settings = self.app.events_settings
        return outbox_tables(settings.outbox_table, settings.outbox_schema)

    def store(self, url: str | None = None, engine: Engine | None = None) -> OutboxStore:
        """The outbox on ``engine``, or on the database at ``url`` (default: the app's ``outbox_url``)."""
        from sqlalchemy import create_engine

        engine = engine or create_engine(url or self.app.outbox_url, pool_pre_ping=True)
        return OutboxStore(engine, self.tables, self.app.events_settings.outbox_max_attempts)

    @cached_property
    def relay(self) -> RelayThread | None:
        """The in-process relay (``amqp_events_outbox_relay``), started on the first outbox write."""
        settings = self.app.events_settings
        if not settings.outbox_relay:
            return None
        return RelayThread(self.app.service, lambda engine: self.store(engine=engine), bool(settings.outbox_url))

    def stop(self) -> None:
        relay = self.__dict__.get("relay")
        if relay is not None:
            relay.stop()
