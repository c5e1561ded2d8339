"""``amqp-events topology show|declare|move|retire|check|permissions``."""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

import click

from amqp_events.cli.context import Context, one_line_errors, pass_context
from amqp_events.layouts import move_layout
from amqp_events.topology import Topology
from amqp_events.topology.check import differences, expected_bindings
from amqp_events.topology.permissions import rabbitmqctl_commands, service_grants
from amqp_events.transport.management import live_topology
from amqp_events.transport.retire import own_parts


@click.group()
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
    keys: dict[tuple[str, str], list[str]] = {}  # a partition's slots on one line
    for link in described["bindings"]:
        keys.setdefault((link["source"], link["destination"]), []).append(link["routing_key"])
    for (source, destination), routing_keys in keys.items():
        ordered = sorted(routing_keys, key=lambda key: (not key.isdigit(), int(key) if key.isdigit() else 0, key))
        click.echo(f"  {source} -> {destination}  [{', '.join(ordered)}]")


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
    declared = app.topology
    click.echo(
        f"declared {len(declared.exchanges)} exchanges, {len(declared.queues)} queues and "
        f"{len(declared.bindings)} extra bindings for service {app.service!r}"
    )


@topology.command("retire")
@click.option("--discard", is_flag=True, help="Delete queues that still hold messages (their events are lost).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_context
@one_line_errors
def topology_retire(context: Context, discard: bool, yes: bool) -> None:
    """Delete the service's own queues and exchanges, so that events stop collecting for a service that is gone.

    Stop its workers first: while a consumer reads one of its queues, or one holds messages (events not handled
    yet, its archive) and --discard is not given, nothing is deleted. What every service shares stays.
    """
    app = context.app
    queues, exchanges = own_parts(app.topology)
    click.echo(f"service {app.service!r} on vhost {context.vhost!r}: {len(queues)} queues, {len(exchanges)} exchanges")
    for name in [*queues, *exchanges]:
        click.echo(f"  {name}")
    warning = " and every message they hold" if discard else ""
    if not yes and not click.confirm(f"Delete these{warning}?"):
        raise SystemExit(1)
    retired = app.rabbitmq.retire(app.topology, discard)
    _deleted_and_kept(retired.deleted, retired.kept)
    if retired.kept:
        raise click.ClickException(
            f"nothing deleted: {len(retired.kept)} queue(s) still in use or holding messages; stop the service's "
            "workers, replay or export what they hold (or give --discard), then run it again"
        )


@topology.command("move")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_context
@one_line_errors
def topology_move(context: Context, yes: bool) -> None:
    """Move the service's waiting events into the queue layout its settings name (amqp_events_queue_layout).

    Stop the service's workers first, run this with the new setting, then start its workers. Each message is
    removed from its old queue once its copies are confirmed in the new one; an old queue is deleted once empty
    and unread. What is addressed to an old queue by its name later (a retry on the delay ladder, a replay of an
    archived event) reaches the new layout.
    """
    app = context.app
    layout = app.events_settings.queue_layout
    if not yes and not click.confirm(
        f"Move service {app.service!r} on vhost {context.vhost!r} to the {layout} layout?"
    ):
        raise SystemExit(1)
    moved = move_layout(app.context, app.rabbitmq)
    for queue, count in moved.moved.items():
        click.echo(f"moved {count} message(s) out of {queue}")
    _deleted_and_kept(moved.deleted, moved.kept)
    if moved.kept:
        raise click.ClickException(
            f"{len(moved.kept)} queue(s) of the old layout kept: stop the workers that read them, then run it again"
        )
    click.echo(f"service {app.service!r} is in the {layout} layout")


def _deleted_and_kept(deleted: list[str], kept: dict[str, str]) -> None:
    for name in deleted:
        click.echo(f"deleted {name}")
    for name, why in kept.items():
        click.echo(f"kept {name}: {why}")


@topology.command("check")
@pass_context
@one_line_errors
def topology_check(context: Context) -> None:
    """Compare with the live broker (management API), replicas included; exit status 1 when anything is wrong."""
    live = live_topology(context.management, context.vhost)
    warn_at = context.app.events_settings.quorum_queue_warning
    found = differences(context.app.topology, live, context.vhost, warn_at)
    for difference in found:
        click.echo(str(difference))
    if any(difference.wrong for difference in found):
        raise SystemExit(1)
    click.echo(f"the broker matches the topology of service {context.app.service!r} ({len(live.nodes)} node(s))")


@topology.command("permissions")
@click.option("--user", help="The RabbitMQ user of the service (default: the service's name).")
@click.option(
    "--apply",
    is_flag=True,
    help="Give the user these permissions through the management API (as its administrator: --management-url or "
    "AMQP_EVENTS_MANAGEMENT_USER/PASSWORD), creating the user if it does not exist.",
)
@click.option(
    "--password-env",
    metavar="VARIABLE",
    help="With --apply: the environment variable that holds the password of a user to create.",
)
@pass_context
@one_line_errors
def topology_permissions(context: Context, user: str | None, apply: bool, password_env: str | None) -> None:
    """Print the RabbitMQ permissions the service's user needs, as rabbitmqctl commands (or give them: --apply).

    They grant the service its own queues and exchanges, and writing to (or binding from) what every service
    shares, never configuring it: declare that as an administrator (`topology declare`) and set
    amqp_events_shared_topology = "check" in the service's app.
    """
    app = context.app
    grants = service_grants(app.service, app.events_settings)
    if apply:
        name = user or app.service
        password = os.environ.get(password_env) if password_env else None
        done = context.management.grant(context.vhost, name, grants, password)
        said = {
            "created": f"created user {name!r}",
            "password set": f"updated user {name!r}: its password set",
            "kept": f"updated user {name!r} (its password unchanged: none given)",
        }[done]
        click.echo(f"{said}; its permissions on vhost {context.vhost!r} given")
        return
    click.echo(
        f"# service {app.service!r} on vhost {context.vhost!r}; the shared topology declared by an administrator "
        "(`amqp-events -A <app> topology declare`), the app set with amqp_events_shared_topology = 'check'"
    )
    name = user or app.service
    # Setting permissions never creates the user: rabbitmqctl refuses them for a user that does not exist.
    click.echo(
        f"# the user first, when it does not exist (or --apply --password-env VARIABLE creates it): "
        f'rabbitmqctl add_user {shlex.quote(name)} "$PASSWORD"'
    )
    for line in rabbitmqctl_commands(grants, name, context.vhost):
        click.echo(line)
