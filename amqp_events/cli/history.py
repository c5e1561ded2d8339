"""``amqp-events history replay|find|show|stats``: the vhost's event history (``amqp_events_history``)."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

import click

from amqp_events.cli.context import current_context, one_line_errors
from amqp_events.clock import parse_moment
from amqp_events.errors import TopologyMissing
from amqp_events.history import HistoricEvent, History, Query, parse_where
from amqp_events.topology.names import HISTORY_STREAM

F = TypeVar("F", bound=Callable[..., Any])


def moment(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    """A time: ISO-8601 (UTC unless it says otherwise), or how long ago (``90m``, ``2h``, ``7D``)."""
    if value is None:
        return None
    try:
        return parse_moment(value, datetime.now(timezone.utc))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def history_of() -> History:
    app = current_context().app
    return app.history()


def needing_history(command: F) -> F:
    """A missing history stream, said as what to do about it."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except TopologyMissing as exc:
            if HISTORY_STREAM not in str(exc):
                raise
            raise click.ClickException(
                f"no history on this vhost (no stream {HISTORY_STREAM!r}): set amqp_events_history=True in a "
                "service's app and start its worker, or run `amqp-events -A APP topology declare` for it"
            ) from None

    return wrapper  # type: ignore[return-value]


def query_of(since: datetime | None, until: datetime | None, event: str | None, where: Sequence[str]) -> Query:
    try:
        return Query(since=since, until=until, events=event, where=parse_where(where))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--where") from None


def choosing(command: Any) -> Any:
    """The options that choose events (the command receives them as ``query``)."""
    options = [
        click.option("--since", metavar="TIME", callback=moment, help="Events since TIME (ISO-8601, or ago: 2h, 7D)."),
        click.option("--until", metavar="TIME", callback=moment, help="Events before this time."),
        click.option("--event", metavar="PATTERN", help="Events whose name matches (as a topic binding: billing.#)."),
        click.option(
            "--where", multiple=True, metavar="NAME=VALUE", help="An argument (or id, key, fired_by) equal to this."
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _line(event: HistoricEvent, history: History) -> str:
    return json.dumps(event.summary(history.names(event.event)), default=str)


@click.group()
def history() -> None:
    """Every fired event, kept in a stream (amqp_events_history): catch up, rebuild, look back."""


@history.command("replay")
@choosing
@click.option("--handler", help="Only to this handler (its function's name, full name or event).")
@click.option(
    "--rate", type=click.FloatRange(min=0), default=1000.0, show_default=True, help="Events/s at most (0: no bound)."
)
@click.option("--restart", is_flag=True, help="Start over instead of going on from where this replay was interrupted.")
@click.option("--yes", is_flag=True, help="Confirm without asking (handlers without an inbox run events again).")
@one_line_errors
@needing_history
def history_replay(
    since: datetime | None,
    until: datetime | None,
    event: str | None,
    where: Sequence[str],
    handler: str | None,
    rate: float,
    restart: bool,
    yes: bool,
) -> None:
    """Deliver past events to this service's handlers only, resumably (how far it got is kept in the queue
    <service>.history.cursor: the same command started again goes on from there)."""
    if since is None:
        raise click.UsageError("say where the replay starts: --since TIME (ISO-8601, or ago: 90m, 2h, 7D)")
    try:
        replay = history_of().replay(query_of(since, until, event, where), handler, rate, restart)
    except LookupError as exc:
        raise click.ClickException(str(exc.args[0])) from None
    repeating = replay.without_inbox
    if repeating and not yes:
        names = ", ".join(handler.name for handler in repeating)
        warning = f"{names} ha{'s' if len(repeating) == 1 else 've'} no inbox: an event already handled runs again"
        if not sys.stdin.isatty():
            raise click.UsageError(f"{warning} (effects may repeat). Confirm with --yes")
        click.confirm(f"{warning}, effects may repeat. Replay?", abort=True)
    bar: Any = None
    first = 0

    def progress(offset: int, end: int) -> None:
        nonlocal bar, first
        if bar is None:
            first = offset
            bar = click.progressbar(length=end - offset + 1, label="replaying", file=sys.stderr).__enter__()
        bar.update(offset - first + 1 - bar.pos)

    try:
        report = replay.run(progress)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    resumed = "" if report.resumed_from is None else f", going on from offset {report.resumed_from}"
    click.echo(f"replayed {report.replayed} event(s) to {replay.context.name} (replay {report.replay}{resumed})")


@history.command("find")
@choosing
@click.option("--limit", type=click.IntRange(min=1), help="At most this many events.")
@one_line_errors
@needing_history
def history_find(
    since: datetime | None, until: datetime | None, event: str | None, where: Sequence[str], limit: int | None
) -> None:
    """The events that match, oldest first: one JSON object per line."""
    store = history_of()
    for found in store.find(query_of(since, until, event, where), limit):
        click.echo(_line(found, store))


@history.command("show")
@click.argument("event_id")
@one_line_errors
@needing_history
def history_show(event_id: str) -> None:
    """The event with this id (one JSON object per copy in the history), with its headers."""
    store = history_of()
    found = store.show(event_id)
    if not found:
        raise click.ClickException(f"no event {event_id!r} in the history")
    for copy in found:
        summary = copy.summary(store.names(copy.event))
        click.echo(json.dumps({**summary, "headers": copy.message.headers}, default=str, indent=2))


@history.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@one_line_errors
@needing_history
def history_stats(as_json: bool) -> None:
    """Events per name per hour, their size, the oldest and newest kept."""
    stats = history_of().stats()
    if as_json:
        click.echo(json.dumps(stats.to_json(), indent=2))
        return
    click.echo(f"{stats.events} event(s), {stats.bytes} bytes, offsets {stats.first_offset}..{stats.last_offset}")
    oldest, newest = (moment.isoformat() if moment else "-" for moment in (stats.oldest, stats.newest))
    click.echo(f"oldest {oldest}, newest {newest}")
    for (name, hour), count in sorted(stats.per_hour.items()):
        click.echo(f"  {hour}  {count:8d}  {name}")
