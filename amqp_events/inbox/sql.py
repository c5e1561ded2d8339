"""The inbox table on a SQLAlchemy database: the strong form (:class:`Inbox`) and the weak one (:class:`SqlDedup`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Column, Engine, Float, Index, MetaData, String, Table, delete, exists, func, select, tuple_
from sqlalchemy.orm import Session, sessionmaker

from amqp_events.database import CompiledInsert, create_statements
from amqp_events.inbox.base import EffectKey

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
    """The inbox table of one database: creating it, marking keys, pruning."""

    def __init__(self, engine: Engine, name: str = DEFAULT_TABLE, schema: str | None = None) -> None:
        self.engine, self.table = engine, inbox_table(name, schema)
        self._mark = CompiledInsert(self.table, ("service", "handler", "event_id", "processed_at"), skip_existing=True)

    def create(self) -> None:
        with self.engine.begin() as connection:
            for statement in create_statements([self.table], self.engine.dialect):
                connection.exec_driver_sql(statement)

    def mark(self, connection: Any, key: EffectKey) -> bool:
        """Insert ``key`` unless it is there; ``True`` when this inserted it (waits on an uncommitted twin)."""
        row = {"service": key.service, "handler": key.handler, "event_id": key.event_id, "processed_at": time.time()}
        return bool(connection.exec_driver_sql(*self._mark.parameters(connection.dialect, [row])).rowcount == 1)

    def size(self) -> int:
        """Keys kept (what pruning bounds)."""
        with self.engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(self.table)).scalar_one())

    def prune(self, older_than: float, batch: int = 1000) -> int:
        """Delete keys processed before ``older_than``, ``batch`` rows per (short) transaction."""
        columns = self.table.c
        key = tuple_(columns.service, columns.handler, columns.event_id)
        oldest = select(columns.service, columns.handler, columns.event_id).where(columns.processed_at < older_than)
        pruned = 0
        while True:
            with self.engine.begin() as connection:
                deleted = connection.execute(delete(self.table).where(key.in_(oldest.limit(batch)))).rowcount
            pruned += deleted
            if deleted < batch:
                return pruned


class Inbox(InboxTable):
    """The strong form, on a SQLAlchemy database: ``@app.handler(..., inbox=Inbox(sessions))``.

    ``bind`` is a ``sessionmaker`` (the handler gets a ``Session``) or an
    ``Engine`` (the handler gets a Core ``Connection``), always as its first
    argument (after ``self`` with ``bind=True``), in an open transaction
    that already holds the event's key.
    """

    def __init__(self, bind: sessionmaker[Session] | Engine, table: str = DEFAULT_TABLE, schema: str | None = None):
        self.sessions = bind if isinstance(bind, sessionmaker) else None
        engine = bind.kw["bind"] if isinstance(bind, sessionmaker) else bind
        super().__init__(engine, table, schema)

    @contextmanager
    def transaction(self, key: EffectKey) -> Iterator[tuple[Any, bool]]:
        if self.sessions is not None:
            with self.sessions() as session, session.begin():
                yield session, self.mark(session.connection(), key)
        else:
            with self.engine.begin() as connection:
                yield connection, self.mark(connection, key)


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
        with self.engine.connect() as connection:
            return bool(connection.execute(query).scalar())

    def record(self, key: EffectKey) -> None:
        with self.engine.begin() as connection:
            self.mark(connection, key)
