"""``amqp-events limits show``: each limited handler of a service, its limits, and what the broker counts now."""

from __future__ import annotations

import json

import click

from amqp_events.cli.context import Context, one_line_errors, pass_context
from amqp_events.limits.options import limits_of
from amqp_events.topology.limits import lease_names, limit_prefix, window_queue


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
    shown = []
    for task, handler in sorted(app.handlers.items()):
        found = limits_of(handler)
        if not found:
            continue
        prefix = limit_prefix(app.service, task)
        row: dict[str, object] = {"handler": handler.name, "task": task, "limits": found.describe()}
        if found.concurrency is not None and found.concurrency_key is None:
            row["running"] = transport.leases_held(lease_names(prefix, found.concurrency))
        if found.rates and found.rate_key is None:
            windows = {str(rate): window_queue(prefix, rate.count, rate.seconds, False) for rate in found.rates}
            states = transport.queue_states(window.name for window in windows.values())
            row["started"] = {rate: states.get(window.name, (0, 0))[0] for rate, window in windows.items()}
        shown.append(row)
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    if not shown:
        click.echo(f"no handler of {app.service!r} has a limit")
    for row in shown:
        click.echo(f"{row['task']}  ({row['handler']})  {row['limits']}")
        if "running" in row:
            click.echo(f"  running now: {row['running']}")
        for rate, count in dict(row.get("started", {})).items():  # type: ignore[call-overload]
            click.echo(f"  started in the last window of {rate}: {count}")
