"""``amqp-events``: the operator's command line. Each command group is a module; each a thin layer over the library."""

from __future__ import annotations

import os
import sys

import click

from amqp_events.cli.archive import archive
from amqp_events.cli.asyncapi import asyncapi
from amqp_events.cli.breakers import breakers
from amqp_events.cli.broker import broker
from amqp_events.cli.console import console
from amqp_events.cli.context import Context
from amqp_events.cli.contracts import contracts
from amqp_events.cli.exporter import exporter
from amqp_events.cli.fire import fire
from amqp_events.cli.history import history
from amqp_events.cli.inbox import inbox
from amqp_events.cli.limits import limits
from amqp_events.cli.outbox import outbox
from amqp_events.cli.topology import topology


@click.group()
@click.option("-A", "--app", "app_name", metavar="MODULE[:ATTR]", help="The service's app, as for `celery -A`.")
@click.option("--broker", metavar="URL", help="Use this broker instead of the app's broker_url.")
@click.option(
    "--management-url",
    metavar="URL",
    envvar="AMQP_EVENTS_MANAGEMENT_URL",
    help="RabbitMQ management API (default: the node's own when `amqp-events broker start` started the broker, "
    "else port 15672 on the broker's host).",
)
@click.version_option(package_name="celery-amqp-events")
@click.pass_context
def main(ctx: click.Context, app_name: str | None, broker: str | None, management_url: str | None) -> None:
    """Operate celery-amqp-events services: topology, archive, firing events, a local broker."""
    # As with `celery -A`, the app's module is found from the current directory.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    ctx.obj = Context(app_name, broker, management_url)


commands = (topology, archive, history, fire, outbox, inbox, exporter, broker, breakers, limits, asyncapi, contracts)
for command in (*commands, console):
    main.add_command(command)


def run() -> None:
    """The ``amqp-events`` command: output piped into ``head`` ends quietly, as any command line tool's does
    (only in the command's own process: not when ``main`` is invoked inside another program, such as a test).

    SIGPIPE stays ignored (Python's default): with it, a socket whose peer went away (a browser leaving the
    console mid-response, a broker closing a connection) would kill the process instead of raising an error
    its code handles. Click ends the command at its first write into the closed pipe; what is still buffered
    goes to /dev/null, not into a second error at exit."""
    try:
        main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
