"""The outbox's tables as SQLAlchemy Core objects, and the SQL that creates them (pure: no database here).

``<table>`` holds one row per event written in an application's transaction
and not yet confirmed by the broker; ``<table>_relays`` one row per running
relay (for ``amqp-events outbox status``). Times are seconds since the epoch
(UTC), as floats, so that every database compares them alike.

On PostgreSQL an ``AFTER INSERT`` trigger notifies the channel
``<table>_inserted`` once per statement: relays ``LISTEN`` to it, and a
notification is delivered only when the inserting transaction commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import BigInteger, Column, Float, Integer, MetaData, String, Table, Text, text
from sqlalchemy.engine import Dialect

from amqp_events.database import CompiledInsert, create_statements

DEFAULT_TABLE = "amqp_events_outbox"


#: The columns a writer fills (the others have defaults or belong to relays).
WRITTEN = ("event_id", "event", "service", "exchange", "routing_key", "headers", "body", "created_at", "due_at")


@dataclass(frozen=True)
class OutboxTables:
    """The tables of one outbox (its name and schema are settings)."""

    rows: Table
    relays: Table
    #: What a writer runs for its rows.
    insert: CompiledInsert = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "insert", CompiledInsert(self.rows, WRITTEN))

    @property
    def notify_channel(self) -> str:
        return f"{self.rows.name}_inserted"

    def create_statements(self, dialect: Dialect) -> list[str]:
        """The DDL that creates both tables (and, on PostgreSQL, the trigger that notifies relays)."""
        statements = create_statements(self.tables, dialect)
        if dialect.name == "postgresql":
            statements += self._notify_trigger(dialect)
        return statements

    @property
    def tables(self) -> tuple[Table, Table]:
        return self.rows, self.relays

    def _notify_trigger(self, dialect: Dialect) -> list[str]:
        quote = dialect.identifier_preparer.quote
        schema = f"{quote(self.rows.schema)}." if self.rows.schema else ""
        function = f"{schema}{quote(self.rows.name + '_notify')}"
        return [
            f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN PERFORM pg_notify('{self.notify_channel}', ''); RETURN NULL; END $$",
            f"DROP TRIGGER IF EXISTS {quote(self.rows.name + '_notify')} ON {schema}{quote(self.rows.name)}",
            f"CREATE TRIGGER {quote(self.rows.name + '_notify')} AFTER INSERT ON {schema}{quote(self.rows.name)} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()",
        ]


def outbox_tables(name: str = DEFAULT_TABLE, schema: str | None = None) -> OutboxTables:
    metadata = MetaData(schema=schema or None)
    rows = Table(
        name,
        metadata,
        # Rows of one transaction are published in this order (PostgreSQL hands out ids at insert time).
        Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True),
        Column("event_id", String(64), nullable=False),
        Column("event", String(255), nullable=False),
        Column("service", String(255), nullable=False),
        Column("exchange", String(255), nullable=False),
        Column("routing_key", String(255), nullable=False),
        Column("headers", Text, nullable=False),  # JSON
        Column("body", Text, nullable=False),  # JSON: the task body [args, kwargs, embed]
        Column("created_at", Float, nullable=False),
        # A delayed fire: when it may reach its subscribers (the relay sends it through the delay ladder).
        Column("due_at", Float),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column("claimed_by", String(255)),
        Column("claimed_until", Float),
        Column("last_error", Text),
        # Set when the row can never be published: listed, retried and purged by `amqp-events outbox`.
        # Relays read pending rows in primary-key order, skipping these few: no other index to maintain.
        Column("dead_at", Float),
    )
    relays = Table(
        f"{name}_relays",
        metadata,
        Column("relay", String(255), primary_key=True),
        Column("started_at", Float, nullable=False),
        Column("seen_at", Float, nullable=False),
    )
    return OutboxTables(rows, relays)
