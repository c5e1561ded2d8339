"""``amqp-events breakers [open|close HANDLER]``: see and steer the circuit breakers of a service's workers."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import click

from amqp_events.cli.context import current_context, one_line_errors
from amqp_events.topology.layout import heartbeats_listener


@click.group(invoke_without_command=True)
@click.option("--wait", type=float, help="Seconds to listen (default: two heartbeat intervals).")
@click.pass_context
@one_line_errors
def breakers(ctx: click.Context, wait: float | None) -> None:
    """Breaker and health-check states of the service's live workers, from their heartbeats."""
    if ctx.invoked_subcommand is not None:
        return
    app = current_context().app
    beats = listen(app, wait or 2 * app.events_settings.heartbeat_interval)
    if not beats:
        raise click.ClickException(f"no heartbeat from a worker of {app.service!r}: is one running?")
    for worker, beat in sorted(beats.items()):
        click.echo(worker)
        for handler, state in sorted(beat.get("breakers", {}).items()):
            click.echo(f"  breaker  {state:<9}  {handler}")
        for check, state in sorted(beat.get("health", {}).items()):
            click.echo(f"  health   {state:<9}  {check}")


def listen(app: Any, seconds: float) -> dict[str, dict[str, Any]]:
    """The latest heartbeat of each online worker of ``app``'s service heard within ``seconds``."""
    beats: dict[str, dict[str, Any]] = {}

    def heard(body: Any, message: Any) -> None:
        beat = body if isinstance(body, dict) else json.loads(body)
        if beat.get("service") == app.service:
            if beat.get("state") == "online":
                beats[str(beat.get("worker"))] = beat
            else:
                beats.pop(str(beat.get("worker")), None)
        message.ack()

    end = time.monotonic() + seconds
    with app.connection_for_read() as connection, connection.Consumer(heartbeats_listener("cli"), callbacks=[heard]):
        while time.monotonic() < end:
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=max(0.05, min(1.0, end - time.monotonic())))
    return beats


def steering(action: str, what: str) -> click.Command:
    """The ``breakers open`` or ``breakers close`` command."""

    @click.argument("handler")
    @click.option("--wait", type=float, default=3.0, show_default=True, help="Seconds to wait for workers' replies.")
    @one_line_errors
    def command(handler: str, wait: float) -> None:
        steer(handler, action, wait)

    command.__doc__ = what
    return click.command(action)(command)


breakers.add_command(
    steering("open", "Pause HANDLER (its function's name, full name or event) in every worker of the service.")
)
breakers.add_command(steering("close", "Resume HANDLER in every worker of the service (a breaker turns half-open)."))


def steer(handler: str, action: str, wait: float) -> None:
    app = current_context().app
    replies = app.control.broadcast(
        "amqp_events_breaker",
        arguments={"service": app.service, "handler": handler, "action": action},
        reply=True,
        timeout=wait,
    )
    reached = 0
    for reply in replies:
        for worker, answer in reply.items():
            if not isinstance(answer, dict) or answer.get("service") != app.service:
                continue
            if answer.get("error"):
                raise click.ClickException(f"{worker}: {answer['error']}")
            if answer.get("matched"):
                reached += 1
                click.echo(f"{worker}: {action} {', '.join(answer['matched'])}")
    if not reached:
        raise click.ClickException(f"no worker of {app.service!r} answered with a handler called {handler!r}")
    click.echo(f"{action}: {reached} worker(s)")
