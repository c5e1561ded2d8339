"""``amqp-events inbox init|prune``: the tables that make handlers' effects happen once."""

from __future__ import annotations

import time
from typing import Any

import click

from amqp_events.cli.context import current_context
from amqp_events.cli.outbox import database_errors
from amqp_events.inbox.prune import prunable_stores

DATABASE = click.option(
    "--db",
    "url",
    metavar="URL",
    help="An inbox's database (SQLAlchemy URL); default: every inbox of the app's handlers.",
)
TABLE = click.option("--table", default="amqp_events_inbox", show_default=True, help="The inbox table (with --db).")


def inboxes(url: str | None, table: str) -> list[Any]:
    """The inbox tables to work on: the one at ``url``, or those of the app's handlers (their modules imported)."""
    if url:
        from sqlalchemy import create_engine

        from amqp_events.inbox.sql import InboxTable

        return [InboxTable(create_engine(url), table)]
    app = current_context().app
    found = prunable_stores(app.handlers.values())
    if not found:
        raise click.ClickException(f"no handler of service {app.service!r} has an SQL inbox; name one with --db")
    return found


@click.group()
def inbox() -> None:
    """The inbox tables of handlers whose effect must happen once."""


@inbox.command("init")
@DATABASE
@TABLE
@database_errors
def inbox_init(url: str | None, table: str) -> None:
    """Create the inbox table(s); idempotent."""
    for store in inboxes(url, table):
        store.create()
        click.echo(f"the inbox {store.table.name!r} is ready in {store.engine.url.render_as_string()}")


@inbox.command("prune")
@DATABASE
@TABLE
@click.option("--older-than", type=float, help="Seconds (default: amqp_events_inbox_retention).")
@click.option("--batch", type=click.IntRange(min=1), default=1000, show_default=True, help="Rows per transaction.")
@database_errors
def inbox_prune(url: str | None, table: str, older_than: float | None, batch: int) -> None:
    """Delete the keys of events handled longer ago than the retention, in small transactions."""
    age = current_context().app.events_settings.inbox_retention if older_than is None else older_than
    for store in inboxes(url, table):
        pruned = store.prune(time.time() - age, batch)
        click.echo(f"pruned {pruned} key(s) older than {age:g}s from {store.table.name!r}")
