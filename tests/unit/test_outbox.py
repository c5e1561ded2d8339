"""The outbox's pure parts: its tables' SQL, rows and messages, targets and settings (no database server)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.dialects import postgresql, sqlite

from amqp_events import events_app
from amqp_events.outbox.schema import WRITTEN, outbox_tables
from amqp_events.outbox.store import OutboxRow, row_values
from amqp_events.outbox.targets import target_of
from amqp_events.settings import Settings
from amqp_events.wire.message import OutgoingMessage


def test_postgresql_gets_a_trigger_that_notifies_relays_sqlite_does_not():
    tables = outbox_tables("shop_outbox", schema="billing")
    on_postgresql = "\n".join(tables.create_statements(postgresql.dialect()))
    assert "CREATE TABLE IF NOT EXISTS billing.shop_outbox" in on_postgresql
    assert "CREATE TABLE IF NOT EXISTS billing.shop_outbox_relays" in on_postgresql
    assert "pg_notify('shop_outbox_inserted'" in on_postgresql and "FOR EACH STATEMENT" in on_postgresql
    assert tables.notify_channel == "shop_outbox_inserted"
    assert "TRIGGER" not in "\n".join(outbox_tables().create_statements(sqlite.dialect()))


def test_a_row_gives_back_the_message_it_stores():
    message = OutgoingMessage(
        "events", "billing.invoice.paid", {"task": "billing.invoice.paid", "id": "e1"}, [[1], {}, {}], "e1"
    )
    values = row_values(message, "billing", now=100.0, due_at=130.0)
    assert tuple(values) == WRITTEN  # exactly the columns a writer fills, in the order of its statement
    row = OutboxRow.of({**values, "id": 7, "attempts": 0, "last_error": None, "dead_at": None})
    assert row.message() == message and (row.event, row.service, row.due_at) == (
        "billing.invoice.paid",
        "billing",
        130.0,
    )


@pytest.mark.parametrize(("headers", "body"), [("{not json", "[]"), ("[1, 2]", "[]")])
def test_a_row_that_cannot_be_read_back_says_so(headers, body):
    values = {name: "" for name in WRITTEN} | {"headers": headers, "body": body, "created_at": 0.0, "due_at": None}
    row = OutboxRow.of({**values, "id": 1, "attempts": 0, "last_error": None, "dead_at": None})
    with pytest.raises(ValueError):
        row.message()


def test_the_insert_is_compiled_once_per_dialect_with_its_parameter_style():
    tables = outbox_tables()
    on_sqlite, order = tables.insert.statement(create_engine("sqlite://").dialect)
    assert on_sqlite.count("?") == len(WRITTEN) and order == WRITTEN
    on_postgresql, order = tables.insert.statement(postgresql.psycopg.dialect())
    assert "%(event_id)s" in on_postgresql and order is None
    assert tables.insert.statement(postgresql.psycopg.dialect())[0] is on_postgresql


def test_anything_but_a_database_handle_is_a_clear_error():
    with pytest.raises(TypeError, match="SQLAlchemy Session or Connection, or a Django database connection, not dict"):
        target_of({}, outbox_tables())
    app = events_app("shop")
    with pytest.raises(TypeError, match="not str"), app.outbox("postgresql://nope"):
        pass


def test_outbox_settings_are_checked():
    with pytest.raises(ValueError, match="outbox_batch"):
        Settings(outbox_batch=0)
    with pytest.raises(ValueError, match="outbox_lease"):
        Settings(outbox_lease=0)
    assert events_app("shop").outbox_url.endswith("/tests/unit/shop-outbox.sqlite3")  # next to the module that made it
