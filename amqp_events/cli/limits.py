"""``amqp-events limits show|set``: each limited handler of a service, its limits, what the broker counts now; and
a change of them at run time, in every worker, without a restart."""

from __future__ import annotations

import json

import click

from amqp_events.cli.context import Context, one_line_errors, pass_context
from amqp_events.errors import ManagementError
from amqp_events.limits.operations import in_force, limited_handler, limits_set, set_limit
from amqp_events.limits.options import limits_of
from amqp_events.limits.overrides import KEEP, Override
from amqp_events.limits.rates import Allowance
from amqp_events.topology.limits import lease_names, limit_prefix, window


@click.group()
def limits() -> None:
    """Flow control: the handlers' concurrency and rate limits, counted over the fleet (docs/guides/flow-control.md)."""


@limits.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
@one_line_errors
def limits_show(context: Context, as_json: bool) -> None:
    """Each limited handler: runs at once and starts in each window now (a limit per key: its keys' own)."""
    app = context.app
    transport = app.rabbitmq
    table = _table(context)
    shown = []
    for task, handler in sorted(app.handlers.items()):
        if not limits_of(handler):
            continue
        found = in_force(handler, table)
        prefix = limit_prefix(app.service, task)
        row: dict[str, object] = {
            "handler": handler.name,
            "task": task,
            "limits": found.describe() or "none",
            "set_at_run_time": task in table,
        }
        if found.concurrency is not None and found.concurrency_key is None:
            row["running"] = transport.leases_held(lease_names(prefix, found.concurrency))
        if found.rates and found.rate_key is None:
            row["started"] = {
                _written(each): _started(context, window(prefix, each.count, each.millis, False, each.paced).queue.name)
                for each in found.windows
            }
        shown.append(row)
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    if not shown:
        click.echo(f"no handler of {app.service!r} has a limit")
    for row in shown:
        click.echo(
            f"{row['task']}  ({row['handler']})  {row['limits']}"
            + ("  (set at run time; `limits set --reset` goes back to the code's)" if row["set_at_run_time"] else "")
        )
        if "running" in row:
            click.echo(f"  running now: {row['running']}")
        for window_of, count in dict(row.get("started", {})).items():  # type: ignore[call-overload]
            click.echo(f"  started in the last {window_of}: {'unknown' if count is None else count}")


def _written(allowance: Allowance) -> str:
    """A window as an operator reads it: ``1.2 s (paced, 1 at most)`` or ``60 s (60 at most)``."""
    seconds = f"{allowance.millis / 1000:g} s"
    return f"{seconds} ({'paced, ' if allowance.paced else ''}{allowance.count} at most)"


def _started(context: Context, window: str) -> int | None:
    """The starts a window counts now: the bytes of its messages (a start is one), as the management API saw them
    a few seconds ago; ``None`` when it cannot be asked."""
    try:
        queue = context.management.queue(context.vhost, window)
    except ManagementError as exc:
        click.echo(f"the starts counted are not shown: {exc}", err=True)
        return None
    return int((queue or {}).get("message_bytes") or 0)


@limits.command("set")
@click.argument("handler")
@click.option("--concurrency", metavar="N|none", help="Runs at once over the service's workers.")
@click.option("--rate-limit", metavar="RATE|none", help="Runs started per window: '50/m', '10/s,100000/d'.")
@click.option("--reset", is_flag=True, help="Go back to the limits in the handler's code.")
@pass_context
@one_line_errors
def limits_set_command(
    context: Context, handler: str, concurrency: str | None, rate_limit: str | None, reset: bool
) -> None:
    """Change HANDLER's limits in every worker of the service, from a moment after, without a restart; they stay
    in force (for workers started later too) until set again or --reset. HANDLER: its function's name, full name
    or event; it must have a limit in its code (concurrency= or rate_limit=)."""
    if reset == (concurrency is not None or rate_limit is not None):
        raise click.UsageError("give --concurrency and/or --rate-limit, or --reset")
    app = context.app
    try:
        found = limited_handler(app.handlers, handler)
    except LookupError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        now = set_limit(
            app.transport,
            app.service,
            found,
            KEEP if concurrency is None else _count(concurrency),
            KEEP if rate_limit is None else (None if rate_limit.strip().lower() == "none" else rate_limit),
            reset,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    click.echo(f"{found.task_name}: {now.describe() or 'no limit'}" + ("" if reset else " (set at run time)"))


def _table(context: Context) -> dict[str, Override]:
    try:
        return limits_set(context.app.transport, context.app.service)
    except ValueError as exc:
        raise click.ClickException(f"the limits set at run time cannot be read: {exc}") from None


def _count(value: str) -> int | None:
    if value.strip().lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"--concurrency {value!r} is not a whole number (or none)") from None
