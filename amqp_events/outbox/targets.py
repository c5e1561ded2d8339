"""Where outbox rows are written: the application's database handle, in the transaction its business writes use.

* a SQLAlchemy ORM ``Session`` or a Core ``Connection`` (2.x);
* a Django database connection (``django.db.connection``, or ``connections[alias]``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from amqp_events.outbox.schema import OutboxTables
from amqp_events.outbox.store import insert_rows

if TYPE_CHECKING:
    from sqlalchemy import URL, Engine
    from sqlalchemy.engine import Dialect


class Target(Protocol):
    """A database handle rows can be written on."""

    def insert(self, rows: Sequence[Mapping[str, Any]]) -> None: ...

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the transaction the rows were written in commits."""

    def engine(self) -> Engine | None:
        """An engine on the same database, for a relay (``None``: use ``amqp_events_outbox_url``)."""


def target_of(handle: Any, tables: OutboxTables) -> Target:
    """The adapter for ``handle``: a SQLAlchemy Session or Connection, or a Django connection."""
    try:
        from sqlalchemy import Connection
        from sqlalchemy.orm import Session
    except ImportError:  # SQLAlchemy is an optional extra
        Connection = Session = ()  # type: ignore[assignment,misc]
    if isinstance(handle, Session):
        return SessionTarget(handle, tables)
    if isinstance(handle, Connection):
        return ConnectionTarget(handle, tables)
    if type(handle).__module__.startswith("django.") and hasattr(handle, "vendor"):  # also django.db.connection
        return DjangoTarget(handle, tables)
    raise TypeError(
        f"app.outbox() takes a SQLAlchemy Session or Connection, or a Django database connection, "
        f"not {type(handle).__qualname__} (pip install 'celery-amqp-events[sqlalchemy]>=0.3' or '[django]')"
    )


class SessionTarget:
    """A SQLAlchemy ORM ``Session``: rows go on its connection, in its current transaction."""

    def __init__(self, session: Any, tables: OutboxTables) -> None:
        self.session, self.tables = session, tables

    def insert(self, rows: Sequence[Mapping[str, Any]]) -> None:
        insert_rows(self.session.connection(), self.tables, rows)

    def after_commit(self, callback: Callable[[], None]) -> None:
        from sqlalchemy import event

        event.listen(self.session, "after_commit", lambda session: callback(), once=True)

    def engine(self) -> Engine | None:
        bind = self.session.get_bind()
        return blocking(getattr(bind, "engine", bind))


class ConnectionTarget:
    """A SQLAlchemy Core ``Connection``: rows go in its current transaction."""

    def __init__(self, connection: Any, tables: OutboxTables) -> None:
        self.connection, self.tables = connection, tables

    def insert(self, rows: Sequence[Mapping[str, Any]]) -> None:
        insert_rows(self.connection, self.tables, rows)

    def after_commit(self, callback: Callable[[], None]) -> None:
        # Core has no after-commit event; "commit" comes just before it. The relay looks again shortly
        # after a wake-up that found nothing (see Relay.wake), so the rows are not missed.
        from sqlalchemy import event

        event.listen(self.connection, "commit", lambda connection: callback(), once=True)

    def engine(self) -> Engine | None:
        return blocking(self.connection.engine)


#: Async-only drivers, and the blocking driver of the same database a relay thread uses instead.
BLOCKING_DRIVERS = {"asyncpg": "psycopg", "aiosqlite": "pysqlite"}


@functools.lru_cache(maxsize=16)
def _blocking_engine(url: str) -> Engine:
    from sqlalchemy import create_engine

    return create_engine(url, pool_pre_ping=True)


def blocking(engine: Engine) -> Engine:
    """``engine``, or for the engine of an ``AsyncSession`` (its driver runs on an event loop) a blocking engine
    on the same database, for the relay's thread: psycopg 3 does both; asyncpg and aiosqlite have a twin."""
    if not engine.dialect.is_async:
        return engine
    url = engine.url
    driver = url.get_driver_name()
    if driver in BLOCKING_DRIVERS:
        url = url.set(drivername=f"{url.get_backend_name()}+{BLOCKING_DRIVERS[driver]}")
    return _blocking_engine(url.render_as_string(hide_password=False))


#: Django database vendors the outbox supports, and the SQLAlchemy URL scheme of each.
SCHEMES = {"postgresql": "postgresql+psycopg", "sqlite": "sqlite"}


class DjangoTarget:
    """A Django database connection: rows go through its cursor, in the current ``atomic()`` block."""

    def __init__(self, connection: Any, tables: OutboxTables) -> None:
        self.connection = connection
        quote = connection.ops.quote_name
        table = tables.rows
        self.table = f"{quote(table.schema)}.{quote(table.name)}" if table.schema else quote(table.name)

    def insert(self, rows: Sequence[Mapping[str, Any]]) -> None:
        columns = list(rows[0])
        quote = self.connection.ops.quote_name
        sql = (
            f"INSERT INTO {self.table} ({', '.join(quote(column) for column in columns)}) "
            f"VALUES ({', '.join(['%s'] * len(columns))})"
        )
        with self.connection.cursor() as cursor:
            cursor.executemany(sql, [[row[column] for column in columns] for row in rows])

    def after_commit(self, callback: Callable[[], None]) -> None:
        from django.db import transaction

        transaction.on_commit(callback, using=self.connection.alias)

    def engine(self) -> Engine | None:
        from sqlalchemy import create_engine

        return create_engine(database_url(self.connection), pool_pre_ping=True)


def database_url(connection: Any) -> URL:
    """The SQLAlchemy URL of a Django connection's database (for a relay)."""
    from sqlalchemy import URL

    scheme = _scheme(connection.vendor)
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return URL.create(scheme, database=str(settings["NAME"]))
    return URL.create(
        scheme,
        username=settings.get("USER") or None,
        password=settings.get("PASSWORD") or None,
        host=settings.get("HOST") or None,
        port=int(settings["PORT"]) if settings.get("PORT") else None,
        database=settings.get("NAME") or None,
    )


def dialect_of(connection: Any) -> Dialect:
    from sqlalchemy import create_engine

    return create_engine(f"{_scheme(connection.vendor)}://").dialect


def _scheme(vendor: str) -> str:
    try:
        return SCHEMES[vendor]
    except KeyError:
        raise NotImplementedError(f"the outbox supports {' and '.join(SCHEMES)} databases, not {vendor}") from None
