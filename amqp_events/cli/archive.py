"""``amqp-events archive list|show|replay|purge|export|import|parked``.

Replay and purge act on exactly the messages they listed (and the operator
confirmed): a message archived after the listing is left alone.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from amqp_events.archive import Archive, ArchivedMessage, Selection
from amqp_events.celery import control
from amqp_events.cli.context import current_context, one_line_errors
from amqp_events.topology import delays, parked_queue_name
from amqp_events.topology.names import is_direct_exchange
from amqp_events.wire.parked import PARKS_KEY

F = TypeVar("F", bound=Callable[..., Any])

SERVICE_OPTION = click.option("--service", help="Another service's archive (default: the app's).")


def archive_of(service: str | None) -> Archive:
    return current_context().app.archive(service)


def choosing(verb: str | None = None) -> Callable[[F], F]:
    """Options that choose archived messages; the command receives ``store`` and ``selection``.

    ``verb`` ("Replay", "Purge") also offers ``--id`` to name messages one by one.
    """

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def with_selection(
            *args: Any,
            event: str | None,
            reason: str | None,
            limit: int | None,
            service: str | None,
            ids: Sequence[str] = (),
            **kwargs: Any,
        ) -> Any:
            selection = Selection.of(ids=ids, event=event, reason=reason, limit=limit)
            return command(*args, store=archive_of(service), selection=selection, **kwargs)

        options = [
            click.option("--event", help="Only messages of this event."),
            click.option("--reason", help="Only messages archived for this reason (e.g. max_retries)."),
            click.option("--limit", type=click.IntRange(min=1), help="At most this many messages."),
            SERVICE_OPTION,
        ]
        if verb:
            options.insert(0, click.option("--id", "ids", multiple=True, help=f"{verb} this message (repeatable)."))
        decorated: Any = with_selection
        for option in reversed(options):
            decorated = option(decorated)
        return decorated  # type: ignore[no-any-return]

    return decorate


@click.group()
def archive() -> None:
    """The messages that ran out of retries or can never succeed."""


@archive.command("list")
@choosing()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@one_line_errors
def archive_list(store: Archive, selection: Selection, as_json: bool) -> None:
    """One row per archived message (nothing is consumed)."""
    entries = store.list(selection)
    if as_json:
        click.echo(json.dumps([entry.summary() for entry in entries], indent=2))
        return
    rows = [
        [
            e.id,
            e.event,
            e.service,
            e.reason + (f", parks key {e.headers[PARKS_KEY]}" if PARKS_KEY in e.headers else ""),
            e.exception_type.rsplit(".", 1)[-1],
            _shorten(e.exception_message, 50),
            str(e.attempts),
            e.archived_at.strftime("%Y-%m-%d %H:%M:%S") if e.archived_at else "",
        ]
        for e in entries
    ]
    _table(["ID", "EVENT", "SERVICE", "REASON", "EXCEPTION", "MESSAGE", "ATTEMPTS", "ARCHIVED AT (UTC)"], rows)
    click.echo(f"{len(entries)} archived message(s)")


@archive.command("show")
@click.argument("message_id")
@SERVICE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@one_line_errors
def archive_show(message_id: str, service: str | None, as_json: bool) -> None:
    """Everything about one archived message, payload and traceback included."""
    entry = one_entry(archive_of(service), message_id)
    if as_json:
        click.echo(json.dumps(entry.to_json(), indent=2))
        return
    for key, value in entry.summary().items():
        if key != "cloudevent" and value not in (None, ""):  # what does not apply is left out
            click.echo(f"{key + ':':<20}{value}")
    if entry.cloud_event:
        click.echo("cloudevent:")
        for name, value in sorted(entry.cloud_event.items()):
            click.echo(f"  {name + ':':<18}{value}")
    click.echo(f"{'routing key:':<20}{fired_with(entry)}")
    click.echo(f"{'content type:':<20}{entry.content_type}")
    arguments = entry.named_arguments
    if arguments is not None:
        click.echo("arguments:")
        for name, value in arguments.items():
            click.echo(f"  {name + ':':<18}{json.dumps(value, default=str)}")
    else:
        payload = entry.payload
        shown = json.dumps(payload, indent=2, default=str) if payload is not None else f"  (raw) {entry.body[:500]!r}"
        click.echo("payload:\n" + shown)
    click.echo("traceback:")
    click.echo(entry.traceback or "  (none)")


def one_entry(store: Archive, message_id: str) -> ArchivedMessage:
    """The archived message of id ``message_id``, or the only one whose id starts with it."""
    entry = store.get(message_id)
    if entry is not None:
        return entry
    found = [entry for entry in store.list() if entry.id.startswith(message_id)]
    if len(found) == 1:
        return found[0]
    if found:
        raise click.ClickException(
            f"{len(found)} archived messages have an id that starts with {message_id!r}: give more of it"
        )
    raise click.ClickException(f"no archived message with id {message_id!r} (or starting with it)")


@archive.command("replay")
@choosing("Replay")
@click.option("--dry-run", is_flag=True, help="Only show what would be replayed.")
@click.option("--new-id", is_flag=True, help="Give each copy a new event id, so that an inbox does not skip it.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--by", default="", help="Who replays (logged, and on the replay's span); default: user@host.")
@one_line_errors
def archive_replay(store: Archive, selection: Selection, dry_run: bool, new_id: bool, yes: bool, by: str) -> None:
    """Send archived messages back to their queue with the attempt count reset.

    Each archived copy is removed only after the broker confirmed its replacement.
    """
    chosen = store.list(selection)
    if not chosen:
        click.echo("nothing to replay")
        return
    _show(chosen, "would replay" if dry_run else "to replay")
    if dry_run:
        click.echo(f"{len(chosen)} message(s) would be replayed")
        return
    _confirm(f"Replay these {len(chosen)} archived message(s) of service {store.service!r}?", yes)
    with click.progressbar(length=len(chosen), label="replaying", file=sys.stderr) as bar:
        report = store.replay(
            Selection.exactly(chosen), on_replayed=lambda _: bar.update(1), new_ids=new_id, replayed_by=by
        )
    for message_id in report.replayed:
        click.echo(f"replayed {message_id}")
    click.echo(f"replayed {len(report.replayed)} message(s)")
    _gone(chosen, [*report.replayed, *report.unroutable, *report.cut])
    if report.cut:
        click.echo(
            f"{len(report.cut)} message(s) stayed in the archive: their body was cut when they were archived (too "
            f"large), so they cannot run again (`archive show` says what was cut): {', '.join(report.cut)}",
            err=True,
        )
    if report.unroutable:
        raise click.ClickException(
            f"{len(report.unroutable)} message(s) stayed in the archive: their queue does not exist "
            f"(start the service's worker or run `topology declare` first): {', '.join(report.unroutable)}"
        )


@archive.command("purge")
@choosing("Purge")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@one_line_errors
def archive_purge(store: Archive, selection: Selection, yes: bool) -> None:
    """Delete archived messages for good."""
    chosen = store.list(selection)
    if not chosen:
        click.echo("nothing to purge")
        return
    _show(chosen, "to purge")
    _confirm(f"Delete these {len(chosen)} archived message(s) of service {store.service!r} for good?", yes)
    purged = store.purge(Selection.exactly(chosen))
    for message_id in purged:
        click.echo(f"purged {message_id}")
    click.echo(f"purged {len(purged)} message(s)")
    _gone(chosen, purged)


@archive.command("export")
@click.argument("file", type=click.File("w"))
@choosing()
@one_line_errors
def archive_export(file: Any, store: Archive, selection: Selection) -> None:
    """Write archived messages to FILE as JSON lines (they stay in the archive)."""
    click.echo(f"exported {store.export(file, selection)} message(s)", err=True)


@archive.command("import")
@click.argument("file", type=click.File("r"))
@SERVICE_OPTION
@one_line_errors
def archive_import(file: Any, service: str | None) -> None:
    """Put messages written by `archive export` back into the archive."""
    click.echo(f"imported {archive_of(service).load(file)} message(s)")


def _show(entries: list[ArchivedMessage], what: str) -> None:
    for entry in entries:
        click.echo(f"{what} {entry.id} ({entry.event}, {entry.reason}) from {entry.queue}", err=True)


def _gone(chosen: list[ArchivedMessage], done: list[str]) -> None:
    """Say which listed messages left the archive before the command reached them (expired, purged, replayed)."""
    gone = sorted({entry.id for entry in chosen} - set(done))
    if gone:
        click.echo(f"no longer in the archive, left alone: {', '.join(gone)}", err=True)


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.ClickException("refusing to go on without --yes: stdin is not a terminal to confirm on")
    click.confirm(question, abort=True)


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=False)]
    for row in [headers, *rows]:
        click.echo("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def fired_with(entry: ArchivedMessage) -> str:
    """The routing key the event was fired with: its name, also when it came through the delay ladder or
    straight to its queue (a retry, a replay), whose own routing keys are the library's."""
    internal = delays.is_ladder_level(entry.exchange) or is_direct_exchange(entry.exchange)
    if internal or delays.is_delivery_exchange(entry.exchange) or not entry.exchange:
        return entry.event
    return entry.routing_key


@archive.command("parked")
@click.option("--wait", type=float, default=3.0, show_default=True, help="Seconds to wait for workers' replies.")
@one_line_errors
def archive_parked(wait: float) -> None:
    """The keys of ordered handlers parked behind an archived event, and how many events wait behind each.

    The workers consuming the partitions answer; a partition no worker has read since it connected shows how
    many messages its parked queue holds.
    """
    app = current_context().app
    partitions = control.parked(app, app.service, wait)
    read = set(partitions)
    rows = [
        [key or "(every key)", partition, _waiting_for(key, parked["head"]), str(parked["waiting"])]
        for partition, keys in partitions.items()
        for key, parked in keys.items()
    ]
    _table(["KEY", "PARTITION", "WAITING FOR", "EVENTS WAITING"], sorted(rows))
    click.echo(f"{sum(row[0] != '(every key)' for row in rows)} parked key(s)")
    for partition in range(app.context.settings.partitions):
        queue = parked_queue_name(app.service, partition)
        if queue.removesuffix(".parked") not in read and (count := app.transport.count(queue)):
            click.echo(f"{queue}: {count} message(s), not read by a worker since it connected")


def _waiting_for(key: str, head: str) -> str:
    """What a parked sequence waits for: an archived event, or (the gate, no key) a history replay to finish."""
    return head if key else f"history replay {head}"
