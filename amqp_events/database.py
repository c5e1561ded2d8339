"""What the outbox and the inbox share about SQL databases (SQLAlchemy Core; no connection here).

* the DDL of a set of tables, for a dialect (``amqp-events outbox|inbox init`` and the Django migrations run it);
* an ``INSERT`` compiled once per dialect: cheaper than building a Core statement on every write, which matters
  on the hot path of a request (the outbox) or of a handler (the inbox).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable


def create_statements(tables: Iterable[Table], dialect: Dialect) -> list[str]:
    """``CREATE TABLE`` and ``CREATE INDEX`` statements for ``tables``, each if it does not exist yet."""
    statements = []
    for table in tables:
        statements.append(str(CreateTable(table, if_not_exists=True).compile(dialect=dialect)))
        statements += [str(CreateIndex(index, if_not_exists=True).compile(dialect=dialect)) for index in table.indexes]
    return statements


@dataclass
class CompiledInsert:
    """``INSERT INTO table (columns)``, compiled once per dialect; ``skip_existing`` adds ``ON CONFLICT DO NOTHING``."""

    table: Table
    columns: tuple[str, ...]
    skip_existing: bool = False
    _compiled: dict[str, tuple[str, tuple[str, ...] | None]] = field(default_factory=dict, repr=False)

    def statement(self, dialect: Dialect) -> tuple[str, tuple[str, ...] | None]:
        """The SQL, and the order of positional parameters (``None``: the dialect takes them by name)."""
        found = self._compiled.get(dialect.name)
        if found is None:
            statement: Any = insert(self.table)
            if self.skip_existing:
                insert_of: Any = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}[dialect.name]
                statement = insert_of(self.table).on_conflict_do_nothing()
            compiled = statement.compile(dialect=dialect, column_keys=list(self.columns))
            positional = tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
            found = self._compiled[dialect.name] = (str(compiled), positional)
        return found

    def parameters(self, dialect: Dialect, rows: Sequence[Mapping[str, Any]]) -> tuple[str, Any]:
        """The SQL and the parameters for ``rows`` (one row: a single execute; more: ``executemany``)."""
        sql, order = self.statement(dialect)
        params = [tuple(row[name] for name in order) for row in rows] if order else list(rows)
        return sql, params[0] if len(params) == 1 else params
