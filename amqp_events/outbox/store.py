"""The outbox table on a database: what writers insert, relays claim and delete, and operators inspect.

Every statement here is short and runs in a transaction of its own, except
:func:`insert_rows`, which runs on the application's connection, inside the
application's transaction.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kombu.utils.json import dumps as json_dumps
from kombu.utils.json import loads as json_loads
from sqlalchemy import Connection, Engine, case, delete, func, insert, or_, select, update

from amqp_events.outbox.schema import OutboxTables
from amqp_events.wire.message import OutgoingMessage


@dataclass(frozen=True)
class OutboxRow:
    """One row of the outbox: an event committed by the application, not yet confirmed by the broker."""

    id: int
    event_id: str
    event: str
    service: str
    created_at: float
    due_at: float | None
    attempts: int
    last_error: str | None
    dead_at: float | None
    exchange: str
    routing_key: str
    headers: str
    body: str

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> OutboxRow:
        return cls(**{name: values[name] for name in cls.__dataclass_fields__})

    def message(self) -> OutgoingMessage:
        """The message to publish; ``ValueError`` when the row cannot be read back."""
        headers, body = json_loads(self.headers), json_loads(self.body)
        if not isinstance(headers, dict):
            raise ValueError(f"the headers of outbox row {self.id} are not a JSON object")
        return OutgoingMessage(self.exchange, self.routing_key, headers, body, self.event_id)

    def summary(self) -> dict[str, Any]:
        """What ``amqp-events outbox list --json`` prints."""
        return {
            "id": self.id,
            "event_id": self.event_id,
            "event": self.event,
            "service": self.service,
            "created_at": self.created_at,
            "due_at": self.due_at,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "dead": self.dead_at is not None,
        }


def row_values(message: OutgoingMessage, service: str, now: float, due_at: float | None) -> dict[str, Any]:
    """The row that stores ``message`` (published as it is, or through the delay ladder until ``due_at``)."""
    return {
        "event_id": message.message_id,
        "event": message.event,
        "service": service,
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "headers": json_dumps(message.headers),
        "body": json_dumps(message.body),
        "created_at": now,
        "due_at": due_at,
    }


def insert_rows(connection: Connection, tables: OutboxTables, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` on the application's ``connection``: in its transaction, one round trip where the
    driver pipelines (psycopg 3 does)."""
    connection.exec_driver_sql(*tables.insert.parameters(connection.dialect, rows))


@dataclass(frozen=True)
class OutboxStats:
    pending: int
    #: created_at of the oldest pending row (None when none is pending).
    oldest: float | None
    dead: int

    def oldest_age(self, now: float) -> float:
        return 0.0 if self.oldest is None else max(0.0, now - self.oldest)


class OutboxStore:
    """The outbox of one database, as relays and operators use it."""

    def __init__(self, engine: Engine, tables: OutboxTables, max_attempts: int = 10) -> None:
        self.engine, self.tables, self.max_attempts = engine, tables, max_attempts

    @property
    def is_postgresql(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    def create(self) -> None:
        """Create the tables (and on PostgreSQL the trigger that notifies relays); idempotent."""
        with self.engine.begin() as connection:
            for statement in self.tables.create_statements(self.engine.dialect):
                connection.exec_driver_sql(statement)

    # -- relays ---------------------------------------------------------------------------------------

    def claim(self, relay: str, limit: int, lease: float) -> list[OutboxRow]:
        """Take up to ``limit`` pending rows for ``lease`` seconds, oldest first.

        Rows another relay holds (a lease not yet expired, or rows being
        claimed at this moment: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL)
        are skipped, so relays never publish the same row in normal operation.
        """
        rows, now = self.tables.rows, time.time()
        pending = (
            select(rows.c.id)
            .where(rows.c.dead_at.is_(None), or_(rows.c.claimed_until.is_(None), rows.c.claimed_until < now))
            .order_by(rows.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        claim = (
            update(rows)
            .where(rows.c.id.in_(pending.scalar_subquery()))
            .values(claimed_by=relay, claimed_until=now + lease)
            .returning(*rows.c)
        )
        with self.engine.begin() as connection:
            claimed = [OutboxRow.of(values._mapping) for values in connection.execute(claim)]
        return sorted(claimed, key=lambda row: row.id)

    def published(self, relay: str, ids: Iterable[int]) -> None:
        """The broker confirmed these rows: delete them (those this relay still holds)."""
        ids = list(ids)
        if ids:
            rows = self.tables.rows
            with self.engine.begin() as connection:
                connection.execute(delete(rows).where(rows.c.id.in_(ids), rows.c.claimed_by == relay))

    def release(self, relay: str, ids: Iterable[int]) -> None:
        """Give rows back untouched (the broker was unavailable): any relay may take them at once."""
        self._update(relay, ids, claimed_by=None, claimed_until=None)

    def failed(
        self, relay: str, errors: Mapping[int, str], permanent: Iterable[int] = (), retry_after: float = 5.0
    ) -> None:
        """These rows could not be published: count the attempt, keep them back ``retry_after`` seconds.

        A row fails for good (dead) when its error is ``permanent`` or after
        ``max_attempts`` attempts; it stays in the table, listed by
        ``amqp-events outbox list`` until retried or purged.
        """
        rows, now = self.tables.rows, time.time()
        permanent = set(permanent)
        with self.engine.begin() as connection:
            for row_id, error in errors.items():
                attempts = rows.c.attempts + 1
                dead_at = now if row_id in permanent else case((attempts >= self.max_attempts, now), else_=None)
                connection.execute(
                    update(rows)
                    .where(rows.c.id == row_id, rows.c.claimed_by == relay)
                    .values(
                        attempts=attempts,
                        last_error=error[:2000],
                        claimed_by=None,
                        claimed_until=now + retry_after,
                        dead_at=dead_at,
                    )
                )

    def heartbeat(self, relay: str, started_at: float) -> None:
        relays, now = self.tables.relays, time.time()
        with self.engine.begin() as connection:
            seen = connection.execute(update(relays).where(relays.c.relay == relay).values(seen_at=now))
            if not seen.rowcount:
                connection.execute(insert(relays).values(relay=relay, started_at=started_at, seen_at=now))

    def forget(self, relay: str) -> None:
        relays = self.tables.relays
        with self.engine.begin() as connection:
            connection.execute(delete(relays).where(relays.c.relay == relay))

    # -- operators ------------------------------------------------------------------------------------

    def stats(self) -> OutboxStats:
        rows = self.tables.rows
        with self.engine.connect() as connection:
            pending, oldest = connection.execute(
                select(func.count(), func.min(rows.c.created_at)).where(rows.c.dead_at.is_(None))
            ).one()
            dead = connection.execute(select(func.count()).where(rows.c.dead_at.is_not(None))).scalar_one()
        return OutboxStats(int(pending), oldest, int(dead))

    def relays_seen_since(self, moment: float) -> list[tuple[str, float, float]]:
        """``(relay, started_at, seen_at)`` of the relays that reported after ``moment``."""
        relays = self.tables.relays
        with self.engine.connect() as connection:
            found = connection.execute(
                select(relays.c.relay, relays.c.started_at, relays.c.seen_at)
                .where(relays.c.seen_at >= moment)
                .order_by(relays.c.relay)
            )
            return [(name, started, seen) for name, started, seen in found]

    def rows(self, dead: bool | None = None, ids: Sequence[int] = (), limit: int | None = None) -> list[OutboxRow]:
        """Rows oldest first: all, only the dead (``True``) or only the pending (``False``); or by id."""
        rows = self.tables.rows
        query = select(rows).order_by(rows.c.id).limit(limit)
        if dead is not None:
            query = query.where(rows.c.dead_at.is_not(None) if dead else rows.c.dead_at.is_(None))
        if ids:
            query = query.where(rows.c.id.in_(ids))
        with self.engine.connect() as connection:
            return [OutboxRow.of(values._mapping) for values in connection.execute(query)]

    def retry(self, ids: Sequence[int]) -> list[int]:
        """Make these dead rows pending again (attempts reset); returns their ids."""
        return self._dead_rows(ids, update(self.tables.rows).values(dead_at=None, attempts=0, claimed_until=None))

    def purge(self, ids: Sequence[int]) -> list[int]:
        """Delete these dead rows for good; returns their ids."""
        return self._dead_rows(ids, delete(self.tables.rows))

    def _dead_rows(self, ids: Sequence[int], statement: Any) -> list[int]:
        rows = self.tables.rows
        with self.engine.begin() as connection:
            touched = connection.execute(
                statement.where(rows.c.id.in_(ids), rows.c.dead_at.is_not(None)).returning(rows.c.id)
            )
            return sorted(row_id for (row_id,) in touched)

    def _update(self, relay: str, ids: Iterable[int], **values: Any) -> None:
        ids = list(ids)
        if ids:
            rows = self.tables.rows
            with self.engine.begin() as connection:
                connection.execute(update(rows).where(rows.c.id.in_(ids), rows.c.claimed_by == relay).values(**values))
