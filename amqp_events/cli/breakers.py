"""``amqp-events breakers [open|close HANDLER]``: see and steer the circuit breakers of a service's workers."""

from __future__ import annotations

import click

from amqp_events.celery import control
from amqp_events.celery.heartbeats import listen
from amqp_events.cli.context import current_context, one_line_errors
from amqp_events.errors import SteeringError


@click.group(invoke_without_command=True)
@click.option("--wait", type=float, help="Seconds to listen (default: two heartbeat intervals).")
@click.pass_context
@one_line_errors
def breakers(ctx: click.Context, wait: float | None) -> None:
    """Breaker and health-check states of the service's live workers, from their heartbeats."""
    if ctx.invoked_subcommand is not None:
        return
    app = current_context().app
    beats = listen(app, wait or 2 * app.events_settings.heartbeat_interval, "cli", app.service)
    if not beats:
        raise click.ClickException(f"no heartbeat from a worker of {app.service!r}: is one running?")
    for (_, worker), beat in sorted(beats.items()):
        click.echo(worker)
        for handler, state in sorted(beat.get("breakers", {}).items()):
            click.echo(f"  breaker  {state:<9}  {handler}")
        for check, state in sorted(beat.get("health", {}).items()):
            click.echo(f"  health   {state:<9}  {check}")


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
    try:
        matched = control.steer(app, app.service, handler, action, wait)
    except SteeringError as exc:
        raise click.ClickException(str(exc)) from None
    if not matched:
        raise click.ClickException(f"no worker of {app.service!r} answered with a handler called {handler!r}")
    for worker, handlers in sorted(matched.items()):
        click.echo(f"{worker}: {action} {', '.join(handlers)}")
    click.echo(f"{action}: {len(matched)} worker(s)")
