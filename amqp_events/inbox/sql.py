"""The inbox table on a SQLAlchemy database: the strong form (:class:`Inbox`) and the weak one (:class:`SqlDedup`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Float,
    Index,
    MetaData,
    String,
    Table,
    delete,
    exists,
    func,
    select,
    tuple_,
)
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from amqp_events.coroutines import complete, entered
from amqp_events.database import CompiledInsert, create_statements
from amqp_events.inbox.base import EffectKey

T = TypeVar("T")

DEFAULT_TABLE = "amqp_events_inbox"


def inbox_table(name: str = DEFAULT_TABLE, schema: str | None = None) -> Table:
    return Table(
        name,
        MetaData(schema=schema or None),
        Column("service", String(255), primary_key=True),
        Column("handler", String(255), primary_key=True),
        Column("event_id", String(64), primary_key=True),
        Column("processed_at", Float, nullable=False),
        Index(f"{name}_processed_at", "processed_at"),  # pruning
    )


class InboxTable:
    """The inbox table of one database: creating it, marking keys, pruning.

    ``engine`` may be an ``AsyncEngine`` (of coroutine handlers): each piece of work then runs in its own
    transaction on the loop of the worker's coroutine handlers, whose connections it shares.
    """

    def __init__(self, engine: Engine | AsyncEngine, name: str = DEFAULT_TABLE, schema: str | None = None) -> None:
        self.async_engine = engine if isinstance(engine, AsyncEngine) else None
        self.engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
        self.table = inbox_table(name, schema)
        self._mark = CompiledInsert(self.table, ("service", "handler", "event_id", "processed_at"), skip_existing=True)

    def in_transaction(self, work: Callable[[Connection], T]) -> T:
        """``work(connection)`` in a transaction of its own."""
        if self.async_engine is None:
            with self.engine.begin() as connection:
                return work(connection)
        with entered(self.async_engine.begin()) as connection:
            return complete(connection.run_sync(work))

    def create(self) -> None:
        def create(connection: Connection) -> None:
            for statement in create_statements([self.table], self.engine.dialect):
                connection.exec_driver_sql(statement)

        self.in_transaction(create)

    def mark(self, connection: Any, key: EffectKey) -> bool:
        """Insert ``key`` unless it is there; ``True`` when this inserted it (waits on an uncommitted twin)."""
        row = {"service": key.service, "handler": key.handler, "event_id": key.event_id, "processed_at": time.time()}
        return bool(connection.exec_driver_sql(*self._mark.parameters(connection.dialect, [row])).rowcount == 1)

    def size(self) -> int:
        """Keys kept (what pruning bounds)."""
        query = select(func.count()).select_from(self.table)
        return self.in_transaction(lambda connection: int(connection.execute(query).scalar_one()))

    def prune(self, older_than: float, batch: int = 1000) -> int:
        """Delete keys processed before ``older_than``, ``batch`` rows per (short) transaction."""
        columns = self.table.c
        key = tuple_(columns.service, columns.handler, columns.event_id)
        oldest = select(columns.service, columns.handler, columns.event_id).where(columns.processed_at < older_than)
        pruned = 0
        prune = delete(self.table).where(key.in_(oldest.limit(batch)))
        while True:
            deleted = self.in_transaction(lambda connection: int(connection.execute(prune).rowcount))
            pruned += deleted
            if deleted < batch:
                return pruned


#: What an :class:`Inbox` hands its handler transactions of.
Bind = sessionmaker[Session] | Engine | async_sessionmaker[AsyncSession] | AsyncEngine


class Inbox(InboxTable):
    """The strong form, on a SQLAlchemy database: ``@app.handler(..., inbox=Inbox(sessions))``.

    ``bind`` is a ``sessionmaker`` (the handler gets a ``Session``) or an
    ``Engine`` (the handler gets a Core ``Connection``), always as its first
    argument (after ``self`` with ``bind=True``), in an open transaction
    that already holds the event's key. A coroutine handler's is an
    ``async_sessionmaker`` (an ``AsyncSession``) or an ``AsyncEngine`` (an
    ``AsyncConnection``).
    """

    def __init__(self, bind: Bind, table: str = DEFAULT_TABLE, schema: str | None = None):
        if isinstance(bind, sessionmaker | async_sessionmaker):
            self.sessions: sessionmaker[Session] | async_sessionmaker[AsyncSession] | None = bind
            super().__init__(bind.kw["bind"], table, schema)
        else:
            self.sessions = None
            super().__init__(bind, table, schema)

    @property
    def is_async(self) -> bool:
        """Is this the inbox of coroutine handlers (async sessions or connections)?"""
        return self.async_engine is not None

    @contextmanager
    def transaction(self, key: EffectKey) -> Iterator[tuple[Any, bool]]:
        sessions = self.sessions
        if self.async_engine is not None:  # entered around a coroutine handler's call, on its loop
            begun: Any = sessions.begin() if isinstance(sessions, async_sessionmaker) else self.async_engine.begin()
            with entered(begun) as handle:
                yield handle, complete(handle.run_sync(lambda sync: self.mark(_connection_of(sync), key)))
        elif isinstance(sessions, sessionmaker):
            with sessions() as session, session.begin():
                yield session, self.mark(session.connection(), key)
        else:
            with self.engine.begin() as connection:
                yield connection, self.mark(connection, key)


def _connection_of(handle: Session | Connection) -> Connection:
    return handle.connection() if isinstance(handle, Session) else handle


class SqlDedup(InboxTable):
    """The weak form in the inbox table: ``@app.handler(..., dedup=SqlDedup(engine))``.

    The key is looked up before the handler runs and inserted after it
    succeeded, in a transaction of its own.
    """

    def seen(self, key: EffectKey) -> bool:
        columns = self.table.c
        query = select(
            exists().where(
                columns.service == key.service, columns.handler == key.handler, columns.event_id == key.event_id
            )
        )
        return self.in_transaction(lambda connection: bool(connection.execute(query).scalar()))

    def record(self, key: EffectKey) -> None:
        self.in_transaction(lambda connection: self.mark(connection, key))
