"""Firing inside ``with app.outbox(...)``: events become rows of the application's own transaction.

A target is the application's database handle, in the transaction its
business writes use:

* a SQLAlchemy ORM ``Session`` or a Core ``Connection`` (2.x);
* a Django database connection (``django.db.connection``, or ``connections[alias]``).

The event is validated and built exactly as when it is published; then its
row is inserted on that handle, so it commits or rolls back with the rest.
Inside ``with app.batch():`` the rows are inserted together when the batch
ends (one ``executemany``). After the transaction commits, the app's
in-process relay (when enabled) is woken.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from amqp_events.core.context import Firing
from amqp_events.core.firing import fired
from amqp_events.outbox.schema import OutboxTables
from amqp_events.outbox.store import insert_rows, row_values

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from amqp_events.outbox.relay import RelayThread


class Target(Protocol):
    """A database handle rows can be written on."""

    def insert(self, rows: Sequence[Mapping[str, Any]]) -> None: ...

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the transaction the rows were written in commits."""

    def engine(self) -> Engine | None:
        """An engine on the same database, for a relay (``None``: use ``amqp_events_outbox_url``)."""


class OutboxWriter:
    """Where a service's events go while ``with app.outbox(target):`` is open (a sink of
    :mod:`amqp_events.core.firing`); ``relay``, if any, is woken after the transaction commits."""

    def __init__(self, service: str, target: Target, relay: RelayThread | None) -> None:
        self.service, self.target, self.relay = service, target, relay
        #: Rows waiting for the end of ``with app.batch():``.
        self._buffer: list[dict[str, Any]] | None = None
        self._wake_pending = False
        #: Ids of the events written in the current batch, in order.
        self.ids: list[str] = []

    def take(self, firing: Firing) -> None:
        """Store the fired message (published after its delay) in the application's transaction."""
        message, delay = firing.message, firing.delay
        now = time.time()
        row = row_values(message, self.service, now, now + delay if delay else None)
        if self._buffer is not None:
            self._buffer.append(row)
            self.ids.append(message.message_id)
        else:
            self.target.insert([row])
        fired(firing, "outbox")
        self._wake_relay_after_commit(firing)

    @contextmanager
    def batch(self) -> Iterator[OutboxWriter]:
        """Collect the rows of a batch and insert them together when it ends (and only if it ends well)."""
        self._buffer, self.ids = [], []
        try:
            yield self
            if self._buffer:
                self.target.insert(self._buffer)
        finally:
            self._buffer = None

    def _wake_relay_after_commit(self, firing: Firing) -> None:
        relay = self.relay
        if relay is None or self._wake_pending:
            return
        relay.use(self.target, firing.context)
        self._wake_pending = True

        def wake() -> None:
            self._wake_pending = False
            relay.wake()

        self.target.after_commit(wake)


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
        from amqp_events.django import DjangoTarget

        return DjangoTarget(handle, tables)
    raise TypeError(
        f"app.outbox() takes a SQLAlchemy Session or Connection, or a Django database connection, "
        f"not {type(handle).__qualname__} (pip install 'celery-amqp-events[sqlalchemy]' or '[django]')"
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
        return getattr(bind, "engine", bind)  # type: ignore[no-any-return]


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
        return self.connection.engine  # type: ignore[no-any-return]
