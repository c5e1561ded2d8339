"""An app's transactional outbox (``app.outbox(...)``, ``app.outbox_store()``): its tables, its store on a
database, and its in-process relay thread (``amqp_events_outbox_relay``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from amqp_events.core.context import ServiceContext
from amqp_events.core.firing import sending_to
from amqp_events.outbox.relay import RelayThread
from amqp_events.outbox.schema import OutboxTables, outbox_tables
from amqp_events.outbox.store import OutboxStore
from amqp_events.outbox.targets import target_of
from amqp_events.outbox.writer import OutboxWriter

if TYPE_CHECKING:
    from sqlalchemy import Engine


class Outbox:
    """The outbox of a service whose default database is ``url``."""

    def __init__(self, context: ServiceContext, url: str) -> None:
        settings = context.settings
        self.service, self.settings, self.url = context.name, settings, url
        self.tables: OutboxTables = outbox_tables(settings.outbox_table, settings.outbox_schema)

    @contextmanager
    def writing(self, transaction: Any, relayed: bool) -> Iterator[OutboxWriter]:
        """Inside the block, what the service fires is written on ``transaction`` (see ``EventsApp.outbox``);
        ``relayed``: wake the in-process relay, if configured, after the transaction commits."""
        relay = self.relay if relayed else None
        writer = OutboxWriter(self.service, target_of(transaction, self.tables), relay)
        with sending_to(writer):
            yield writer

    @asynccontextmanager
    async def writing_async(self, session: Any, relayed: bool) -> AsyncIterator[OutboxWriter]:
        """:meth:`writing` on a SQLAlchemy ``AsyncSession`` or ``AsyncConnection``: the rows are inserted on it
        when the block ends (awaited, in its transaction), as the rows of a batch are."""
        relay = self.relay if relayed else None
        handle = getattr(session, "sync_session", None) or getattr(session, "sync_connection", None)
        if handle is None or not hasattr(session, "run_sync"):
            raise TypeError(
                "app.outbox_async() takes a SQLAlchemy AsyncSession or AsyncConnection, "
                f"not {type(session).__qualname__}"
            )
        target = target_of(handle, self.tables)
        writer = OutboxWriter(self.service, target, relay)
        with sending_to(writer), writer.collecting() as rows:
            yield writer
        if rows:
            await session.run_sync(lambda _: target.insert(rows))

    def store(self, url: str | None = None, engine: Engine | None = None) -> OutboxStore:
        """The outbox on ``engine``, or on the database at ``url`` (default: the service's)."""
        from sqlalchemy import create_engine

        engine = engine or create_engine(url or self.url, pool_pre_ping=True)
        return OutboxStore(engine, self.tables, self.settings.outbox_max_attempts)

    @cached_property
    def relay(self) -> RelayThread | None:
        """The in-process relay (``amqp_events_outbox_relay``), started on the first outbox write."""
        if not self.settings.outbox_relay:
            return None
        return RelayThread(self.service, lambda engine: self.store(engine=engine), bool(self.settings.outbox_url))

    def stop(self) -> None:
        relay = self.__dict__.get("relay")
        if relay is not None:
            relay.stop()
