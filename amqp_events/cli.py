"""``amqp-events``: the operator's command line. Each command is a thin layer over the library."""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from amqp.exceptions import NotFound
from kombu import Connection
from kombu.exceptions import OperationalError

from amqp_events.app import EventsApp, TopologyMissing
from amqp_events.archive import Archive, Selection
from amqp_events.check import LiveTopology, differences, expected_bindings
from amqp_events.declare import TopologyMismatch
from amqp_events.local_broker import LocalBroker, LocalBrokerError
from amqp_events.management import ManagementAPI, ManagementError
from amqp_events.metrics import AVAILABLE
from amqp_events.publisher import PublishError
from amqp_events.topology import InvalidName, Topology

F = TypeVar("F", bound=Callable[..., Any])

#: Failures an operator can act on: one line on stderr and exit status 1, no traceback.
EXPECTED_ERRORS = (
    OperationalError,
    ConnectionError,
    PublishError,
    NotFound,
    TopologyMismatch,
    TopologyMissing,
    ManagementError,
    LocalBrokerError,
    InvalidName,
)


class AppNotFound(click.ClickException):
    pass


def one_line_errors(command: F) -> F:
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except EXPECTED_ERRORS as exc:
            raise click.ClickException(_first_line(exc)) from None

    return wrapper  # type: ignore[return-value]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, NotFound):
        text = f"not found on the broker: {getattr(exc, 'reply_text', text)}"
    return text.splitlines()[0]


class Context:
    """Global options; the app is loaded only by the commands that need it."""

    def __init__(self, app_name: str | None, broker: str | None, management_url: str | None) -> None:
        self.app_name, self.broker, self.management_url = app_name, broker, management_url

    @functools.cached_property
    def app(self) -> EventsApp:
        if not self.app_name:
            raise click.UsageError("this command needs the app: pass -A/--app MODULE[:ATTR]")
        from celery.app.utils import find_app

        sys.path.insert(0, str(Path.cwd()))
        try:
            app = find_app(self.app_name)
        except (ImportError, AttributeError) as exc:
            raise AppNotFound(f"cannot load app {self.app_name!r}: {exc}") from None
        if not isinstance(app, EventsApp):
            raise AppNotFound(f"{self.app_name!r} is a {type(app).__name__}, not an app made with events_app()")
        if self.broker:
            app.conf.broker_url = self.broker
        return app

    @property
    def vhost(self) -> str:
        return str(Connection(self.app.conf.broker_url).virtual_host or "/")

    @property
    def management(self) -> ManagementAPI:
        if self.management_url:
            return ManagementAPI(self.management_url)
        return ManagementAPI.for_amqp_url(self.app.conf.broker_url)


pass_context = click.make_pass_decorator(Context)


@click.group()
@click.option("-A", "--app", "app_name", metavar="MODULE[:ATTR]", help="The service's app, as for `celery -A`.")
@click.option("--broker", metavar="URL", help="Use this broker instead of the app's broker_url.")
@click.option(
    "--management-url",
    metavar="URL",
    envvar="AMQP_EVENTS_MANAGEMENT_URL",
    help="RabbitMQ management API (default: port 15672 on the broker's host).",
)
@click.version_option(package_name="celery-amqp-events")
@click.pass_context
def main(ctx: click.Context, app_name: str | None, broker: str | None, management_url: str | None) -> None:
    """Operate celery-amqp-events services: topology, archive, firing events, a local broker."""
    ctx.obj = Context(app_name, broker, management_url)


# -- topology ----------------------------------------------------------------


@main.group()
def topology() -> None:
    """The exchanges, queues and bindings of the app's service."""


@topology.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def topology_show(context: Context, as_json: bool) -> None:
    """Print the topology, computed without touching the broker."""
    described = describe_topology(context.app.topology)
    if as_json:
        click.echo(json.dumps(described, indent=2))
        return
    click.echo("exchanges:")
    for exchange in described["exchanges"]:
        click.echo(f"  {exchange['name']}  ({exchange['type']}) {_arguments(exchange['arguments'])}")
    click.echo("queues:")
    for queue in described["queues"]:
        click.echo(f"  {queue['name']}  {_arguments(queue['arguments'])}")
    click.echo("bindings:")
    for link in described["bindings"]:
        click.echo(f"  {link['source']} -> {link['destination']}  [{link['routing_key']}]")


def describe_topology(topology: Topology) -> dict[str, Any]:
    return {
        "service": topology.service,
        "exchanges": [
            {"name": e.name, "type": e.type, "durable": e.durable, "arguments": getattr(e, "arguments", None) or {}}
            for e in topology.exchanges
        ],
        "queues": [
            {"name": q.name, "durable": q.durable, "arguments": getattr(q, "queue_arguments", None) or {}}
            for q in topology.queues
        ],
        "bindings": [
            {"source": source, "destination": destination, "destination_type": kind, "routing_key": key}
            for source, destination, kind, key in sorted(expected_bindings(topology))
        ],
    }


def _arguments(arguments: dict[str, Any]) -> str:
    return " ".join(f"{key}={value}" for key, value in sorted(arguments.items()))


@topology.command("declare")
@pass_context
@one_line_errors
def topology_declare(context: Context) -> None:
    """Declare the topology on the broker, as a worker does at start-up (idempotent)."""
    app = context.app
    app.declare_topology()
    topology = app.topology
    click.echo(
        f"declared {len(topology.exchanges)} exchanges, {len(topology.queues)} queues and "
        f"{len(topology.bindings)} extra bindings for service {app.service!r}"
    )


@topology.command("check")
@pass_context
@one_line_errors
def topology_check(context: Context) -> None:
    """Compare with the live broker (management API); exit status 1 when anything differs."""
    live = LiveTopology.read(context.management, context.vhost)
    found = differences(context.app.topology, live, context.vhost)
    for difference in found:
        click.echo(str(difference))
    if found:
        raise SystemExit(1)
    click.echo(f"the broker matches the topology of service {context.app.service!r}")


# -- archive -----------------------------------------------------------------


SERVICE_OPTION = click.option("--service", help="Another service's archive (default: the app's).")


def archive_of(service: str | None) -> Archive:
    context = click.get_current_context().find_object(Context)
    assert context is not None
    return Archive(context.app, service)


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
        return decorated

    return decorate


@main.group()
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
            e.reason,
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
    entry = archive_of(service).get(message_id)
    if entry is None:
        raise click.ClickException(f"no archived message with id {message_id!r}")
    if as_json:
        click.echo(json.dumps(entry.to_json(), indent=2))
        return
    for key, value in entry.summary().items():
        click.echo(f"{key + ':':<20}{value}")
    click.echo(f"{'routing key:':<20}{entry.routing_key}")
    click.echo(f"{'content type:':<20}{entry.content_type}")
    payload = entry.payload
    click.echo("payload:")
    click.echo(json.dumps(payload, indent=2, default=str) if payload is not None else f"  (raw) {entry.body[:500]!r}")
    click.echo("traceback:")
    click.echo(entry.traceback or "  (none)")


@archive.command("replay")
@choosing("Replay")
@click.option("--dry-run", is_flag=True, help="Only show what would be replayed.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@one_line_errors
def archive_replay(store: Archive, selection: Selection, dry_run: bool, yes: bool) -> None:
    """Send archived messages back to their queue with the attempt count reset.

    Each archived copy is removed only after the broker confirmed its replacement.
    """
    chosen = store.list(selection)
    if dry_run or not chosen:
        for entry in chosen:
            click.echo(f"would replay {entry.id} ({entry.event}, {entry.reason}) to {entry.queue}")
        click.echo(f"{len(chosen)} message(s) would be replayed" if dry_run else "nothing to replay")
        return
    _confirm(f"Replay {len(chosen)} archived message(s) of service {store.service!r}?", yes)
    with click.progressbar(length=len(chosen), label="replaying", file=sys.stderr) as bar:
        report = store.replay(Selection.of(ids=[e.id for e in chosen]), on_replayed=lambda _: bar.update(1))
    click.echo(f"replayed {report.replayed} message(s)")
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
    count = len(store.list(selection))
    if not count:
        click.echo("nothing to purge")
        return
    _confirm(f"Delete {count} archived message(s) of service {store.service!r} for good?", yes)
    click.echo(f"purged {store.purge(selection)} message(s)")


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


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.ClickException("refusing to go on without --yes: stdin is not a terminal to confirm on")
    click.confirm(question, abort=True)


# -- fire --------------------------------------------------------------------


@main.command()
@click.argument("event")
@click.option("--json", "payload", metavar="PAYLOAD", help="Keyword arguments as a JSON object (or an array of args).")
@click.option("--arg", "pairs", multiple=True, metavar="KEY=VALUE", help="A keyword argument; VALUE is JSON or text.")
@click.option("--countdown", type=float, help="Seconds to wait on the broker before delivery.")
@pass_context
@one_line_errors
def fire(context: Context, event: str, payload: str | None, pairs: Sequence[str], countdown: float | None) -> None:
    """Fire EVENT from the shell and print its id once the broker confirmed it."""
    args, kwargs = _payload(payload, pairs)
    click.echo(context.app.fire(event, args, kwargs, countdown=countdown))


def _payload(payload: str | None, pairs: Sequence[str]) -> tuple[list[Any], dict[str, Any]]:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    if payload:
        try:
            decoded = json.loads(payload)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--json") from None
        if isinstance(decoded, list):
            args = decoded
        elif isinstance(decoded, dict):
            kwargs = decoded
        else:
            raise click.BadParameter("must be a JSON object or array", param_hint="--json")
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--arg")
        try:
            kwargs[key] = json.loads(value)
        except ValueError:
            kwargs[key] = value
    return args, kwargs


# -- exporter ----------------------------------------------------------------


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve /metrics on.")
@click.option("--port", default=9808, type=int, show_default=True)
@click.option("--interval", default=15.0, show_default=True, help="Seconds between collections from the broker.")
@click.option("--worker-timeout", default=30.0, show_default=True, help="Silent seconds before a worker reads down.")
@click.option("--forget-after", default=600.0, show_default=True, help="Silent seconds before a worker's series go.")
@click.option("--no-management", is_flag=True, help="Use passive declares only (no unacked counts).")
@pass_context
@one_line_errors
def exporter(
    context: Context,
    host: str,
    port: int,
    interval: float,
    worker_timeout: float,
    forget_after: float,
    no_management: bool,
) -> None:
    """Serve the service's queue depths, consumers and workers online as Prometheus metrics."""
    if not AVAILABLE:
        raise click.ClickException("the exporter needs prometheus-client: pip install 'celery-amqp-events[metrics]'")
    from amqp_events.metrics.exporter import Exporter

    management = None if no_management else context.management
    Exporter(context.app, management, interval, worker_timeout, forget_after).serve(host, port)
    click.echo(f"serving metrics of service {context.app.service!r} on http://{host}:{port}/metrics", err=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


# -- local broker ------------------------------------------------------------


@main.group()
def broker() -> None:
    """A private development RabbitMQ node kept in a local directory."""


def broker_options(command: F) -> F:
    command = click.option("--port", type=int, help="AMQP port (default: a free one).")(command)
    return click.option(
        "--dir",
        "directory",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path(".amqp-events/broker"),
        show_default=True,
        help="Where the node keeps its data, logs and state.",
    )(command)


@broker.command("start")
@broker_options
@one_line_errors
def broker_start(directory: Path, port: int | None) -> None:
    """Start the node (it keeps running after this command) and print its URLs."""
    node = LocalBroker(directory, port)
    node.start()
    click.echo(f"broker running: {node.url}")
    click.echo(f"management UI:  {node.management_url}/ (guest/guest)")


@broker.command("stop")
@broker_options
@one_line_errors
def broker_stop(directory: Path, port: int | None) -> None:
    """Stop the node and everything it started."""
    node = LocalBroker(directory, port)
    was_running = node.is_running()
    node.stop()
    click.echo("broker stopped" if was_running else "broker was not running")


@broker.command("status")
@broker_options
def broker_status(directory: Path, port: int | None) -> None:
    """Say whether the node runs; exit status 3 when it does not."""
    node = LocalBroker(directory, port)
    if not node.is_running():
        click.echo(f"no broker running in {directory}")
        raise SystemExit(3)
    click.echo(f"broker running: {node.url}")
    click.echo(f"management UI:  {node.management_url}/ (guest/guest)")


# -- helpers -----------------------------------------------------------------


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=False)]
    for row in [headers, *rows]:
        click.echo("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
