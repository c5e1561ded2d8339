"""``amqp-events contracts check``: the changes to the fleet's event contracts, and which break a consumer; and the
messages at rest that today's handlers would refuse."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from amqp_events.cli.context import Context, one_line_errors, pass_context
from amqp_events.cli.history import moment
from amqp_events.contracts import at_rest
from amqp_events.contracts.fleet import Contract, check, markdown, read
from amqp_events.history import Query

SUFFIXES = (".json", ".yaml", ".yml")
PLACES = ("archive", "history")


@click.group()
def contracts() -> None:
    """The fleet's event contracts, from the services' AsyncAPI documents (`amqp-events -A APP asyncapi`)."""


@contracts.command("check")
@click.argument("baseline", type=click.Path(exists=True, path_type=Path), required=False)
@click.argument("current", type=click.Path(exists=True, path_type=Path), required=False)
@click.option(
    "--against",
    type=click.Choice(PLACES),
    multiple=True,
    help="Also judge the messages at rest there by the app's handlers (-A APP): how many each would refuse.",
)
@click.option("--since", metavar="TIME", callback=moment, help="History: events since TIME (ISO-8601, or ago: 7D).")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="At most this many messages of each place.",
)
@click.option(
    "--format", "output_format", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True
)  # fmt: skip
@pass_context
@one_line_errors
def contracts_check(
    context: Context,
    baseline: Path | None,
    current: Path | None,
    against: tuple[str, ...],
    since: datetime | None,
    limit: int,
    output_format: str,
) -> None:
    """Compare the services' CURRENT documents with the BASELINE ones (each a directory of documents, one per
    service, or one document) and report every change: those that break a consumer (a handler would refuse an
    event fired now, or one fired before and still at rest; an event that services handle is fired by nobody
    any more) and those that break nobody. With --against, also judge the messages waiting in the app's archive
    or on the history stream by its handlers as they are today. Exits 1 when a change breaks a consumer or a
    message at rest would be refused."""
    if (baseline is None) != (current is None) or (baseline is None and not against):
        raise click.UsageError("give BASELINE and CURRENT, or --against archive/history with -A APP, or both")
    findings = check(contracts_in(baseline), contracts_in(current)) if baseline and current else []
    tallies = []
    if against:
        tallies = at_rest.judge(context.app.handlers.values(), messages_at_rest(context, against, since, limit))
    if output_format == "json":
        click.echo(json.dumps({"changes": [f.as_dict() for f in findings], "at_rest": [t.as_dict() for t in tallies]},
                              indent=2, default=str))  # fmt: skip
    else:
        click.echo((markdown(findings) if baseline else "") + (at_rest.markdown(tallies) if against else ""), nl=False)
    if any(finding.breaking for finding in findings) or any(tally.refused for tally in tallies):
        raise SystemExit(1)


def messages_at_rest(
    context: Context, places: tuple[str, ...], since: datetime | None, limit: int
) -> Iterator[at_rest.AtRest]:
    """The messages waiting in the app's archive and on the history stream, as many as ``limit`` of each."""
    app = context.app
    if "archive" in places:
        for entry in app.archive(app.service).list()[:limit]:
            arguments = entry.arguments
            args, kwargs = arguments if arguments is not None else (None, None)
            yield at_rest.AtRest("archive", entry.event, entry.headers, args, kwargs, entry.task)
    if "history" in places:
        for event in app.history().find(Query(since=since), limit):
            yield at_rest.AtRest("history", event.event, event.message.headers, event.args, event.kwargs)


def contracts_in(path: Path | None) -> list[Contract]:
    """The contract of each document at ``path``: a file, or a directory's ``*.json``, ``*.yaml`` and ``*.yml``."""
    if path is None:
        return []
    files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES) if path.is_dir() else [path]
    found = []
    for file in files:
        try:
            found.append(read(_load(file)))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise click.ClickException(f"{file} is not an AsyncAPI document of a service ({exc!r})") from None
    return found


def _load(file: Path) -> Any:
    text = file.read_text()
    if file.suffix == ".json":
        return json.loads(text)
    try:
        import yaml
    except ImportError:
        raise click.ClickException(
            f"reading {file} needs PyYAML: install 'celery-amqp-events[asyncapi]', or write the documents as JSON"
        ) from None
    return yaml.safe_load(text)
