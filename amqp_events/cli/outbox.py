"""``amqp-events outbox init|relay|status|list|retry|purge``: the transactional outbox."""

from __future__ import annotations

import functools
import json
import logging
import signal
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from amqp_events.cli.context import current_context, first_line, one_line_errors
from amqp_events.errors import RelayConflict

if TYPE_CHECKING:  # the outbox needs the [sqlalchemy] extra: imported when a command runs
    from amqp_events.outbox.relay import Relay
    from amqp_events.outbox.store import OutboxRow, OutboxStore

F = TypeVar("F", bound=Callable[..., Any])


def database_option(command: F) -> F:
    return click.option(
        "--db",
        "url",
        metavar="URL",
        help="The outbox's database, as a SQLAlchemy URL (default: amqp_events_outbox_url, or a SQLite file "
        "next to the app).",
    )(command)


def store_of(url: str | None) -> OutboxStore:
    return current_context().app.outbox_store(url)


def database_errors(command: F) -> F:
    """One-line errors for database failures too; a clear one when SQLAlchemy is missing."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            from sqlalchemy.exc import SQLAlchemyError
        except ImportError:
            raise click.ClickException(
                "the outbox and the SQL inbox need SQLAlchemy: pip install 'celery-amqp-events[sqlalchemy]>=0.3'"
            ) from None

        try:
            return command(*args, **kwargs)
        except (SQLAlchemyError, RelayConflict) as exc:
            raise click.ClickException(first_line(exc)) from None
        except ModuleNotFoundError as exc:  # the URL's database driver (SQLAlchemy imports it on first use)
            raise click.ClickException(
                f"{exc}: the database URL's driver is not installed "
                "(PostgreSQL: pip install 'celery-amqp-events[postgres]>=0.3')"
            ) from None

    return one_line_errors(wrapper)  # type: ignore[return-value]


@click.group()
def outbox() -> None:
    """The transactional outbox: its tables, its relay, and the rows that could not be published."""


@outbox.command("init")
@database_option
@database_errors
def outbox_init(url: str | None) -> None:
    """Create the outbox tables (and on PostgreSQL the trigger that wakes relays); idempotent."""
    store = store_of(url)
    store.create()
    click.echo(f"the outbox {store.tables.rows.name!r} is ready in {store.engine.url.render_as_string()}")


@outbox.command("relay")
@database_option
@click.option("--batch", type=click.IntRange(min=1), help="Rows to claim at a time (amqp_events_outbox_batch).")
@click.option("--lease", type=float, help="Seconds a claim lasts (amqp_events_outbox_lease).")
@click.option(
    "--poll-interval", type=float, help="Seconds between looks when not woken (amqp_events_outbox_poll_interval)."
)
@click.option("--metrics-port", type=int, help="Serve the relay's Prometheus metrics on this port.")
@database_errors
def outbox_relay(
    url: str | None, batch: int | None, lease: float | None, poll_interval: float | None, metrics_port: int | None
) -> None:
    """Publish committed outbox rows until stopped (SIGTERM or Ctrl-C end it cleanly)."""
    from amqp_events.outbox.relay import Relay

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s] %(message)s")
    relay = Relay(
        current_context().app.context, store_of(url), batch_size=batch, lease=lease, poll_interval=poll_interval
    )
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, "127.0.0.1")
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: relay.stop())

    def progress(relay: Relay) -> None:
        stats = relay.store.stats()
        click.echo(
            f"relay {relay.name}: {relay.published} published; {stats.pending} pending "
            f"(oldest {stats.oldest_age(time.time()):.1f}s), {stats.dead} dead",
            err=True,
        )

    relay.run(on_progress=progress)


@outbox.command("status")
@database_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@database_errors
def outbox_status(url: str | None, as_json: bool) -> None:
    """Pending rows, the oldest one's age, dead rows, and the relays that reported lately."""
    store = store_of(url)
    stats, now = store.stats(), time.time()
    relays = store.relays_seen_since(now - 30)
    alive = [
        {"relay": name, "up_seconds": round(seen - started), "seen_seconds_ago": round(now - seen, 1)}
        for name, started, seen in relays
    ]
    oldest = round(stats.oldest_age(now), 3)
    if as_json:
        status = {"pending": stats.pending, "oldest_pending_age_seconds": oldest, "dead": stats.dead, "relays": alive}
        click.echo(json.dumps(status, indent=2))
        return
    click.echo(f"pending: {stats.pending} (oldest {oldest}s)")
    click.echo(f"dead:    {stats.dead}")
    click.echo(f"relays:  {len(alive)} reporting" + "".join(f"\n  {relay['relay']}" for relay in alive))


@outbox.command("list")
@database_option
@click.option("--pending", "which", flag_value="pending", help="Only rows waiting to be published.")
@click.option("--all", "which", flag_value="all", help="Pending and dead rows.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@database_errors
def outbox_list(url: str | None, which: str | None, limit: int, as_json: bool) -> None:
    """Rows of the outbox, oldest first: the dead ones unless --pending or --all."""
    dead = {None: True, "pending": False, "all": None}[which]
    rows = store_of(url).rows(dead=dead, limit=limit)
    if as_json:
        click.echo(json.dumps([row.summary() for row in rows], indent=2))
        return
    for row in rows:
        click.echo(_describe(row))
    click.echo(f"{len(rows)} row(s)")


def choosing_rows(verb: str) -> Callable[[F], F]:
    def decorate(command: F) -> F:
        command = click.option("--yes", is_flag=True, help="Do not ask for confirmation.")(command)
        command = click.option("--all", "every", is_flag=True, help=f"{verb} every dead row.")(command)
        return click.option("--id", "ids", type=int, multiple=True, help=f"{verb} this dead row (repeatable).")(command)

    return decorate


@outbox.command("retry")
@database_option
@choosing_rows("Retry")
@database_errors
def outbox_retry(url: str | None, ids: Sequence[int], every: bool, yes: bool) -> None:
    """Make dead rows pending again (their attempts reset): after fixing what made them fail."""
    store = store_of(url)
    chosen = _chosen(store, ids, every, "retry", yes)
    for row_id in store.retry([row.id for row in chosen]):
        click.echo(f"retrying row {row_id}")


@outbox.command("purge")
@database_option
@choosing_rows("Purge")
@database_errors
def outbox_purge(url: str | None, ids: Sequence[int], every: bool, yes: bool) -> None:
    """Delete dead rows for good."""
    store = store_of(url)
    chosen = _chosen(store, ids, every, "delete for good", yes)
    for row_id in store.purge([row.id for row in chosen]):
        click.echo(f"purged row {row_id}")


def _chosen(store: OutboxStore, ids: Sequence[int], every: bool, verb: str, yes: bool) -> list[OutboxRow]:
    if not ids and not every:
        raise click.UsageError("name rows with --id, or pass --all")
    chosen = store.rows(dead=True, ids=ids)
    if not chosen:
        raise click.ClickException("no dead row matches")
    for row in chosen:
        click.echo(_describe(row), err=True)
    if not yes:
        click.confirm(f"{verb.capitalize()} these {len(chosen)} row(s)?", abort=True)
    return chosen


def _describe(row: OutboxRow) -> str:
    state = "dead" if row.dead_at is not None else "pending"
    error = f": {row.last_error}" if row.last_error else ""
    return f"{row.id}  {state}  {row.event}  {row.event_id}  attempts={row.attempts}{error}"
