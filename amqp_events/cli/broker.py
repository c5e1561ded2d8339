"""``amqp-events broker start|stop|status|ctl|kill|restart|partition|heal|install``: a private development
RabbitMQ node, or a cluster, of the machine's RabbitMQ or of another line installed beside it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from amqp_events.cli.context import expecting
from amqp_events.errors import LocalServerError
from amqp_events.local import (
    AMQP_PORT,
    DEFAULT_DIRECTORY,
    node_for,
    nodes_of,
    registry,
    running_elsewhere,
    started_in,
)
from amqp_events.local.broker import LocalBroker
from amqp_events.local.cluster import LocalCluster
from amqp_events.local.installation import DEBIAN_RELEASES, find, install, installed
from amqp_events.local.processes import port_is_free

F = TypeVar("F", bound=Callable[..., Any])


@click.group()
def broker() -> None:
    """A private development RabbitMQ node (or a cluster of nodes) kept in a local directory."""


def directory_option(command: F) -> F:
    return click.option(
        "--dir",
        "directory",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_DIRECTORY,
        show_default=True,
        help="Where the node (or the cluster) keeps its data, logs and state.",
    )(command)


def cluster_in(directory: Path) -> LocalCluster:
    started = started_in(directory)
    if not isinstance(started, LocalCluster):
        raise click.UsageError("kill, restart, partition and heal work on a cluster (`broker start --nodes 3`)")
    return started


def node_of(cluster: LocalCluster, node: str) -> int:
    names = [cluster.node_name(index) for index in range(cluster.size)]
    if node.isdigit() and 1 <= int(node) <= cluster.size:
        return int(node) - 1
    if node in names:
        return names.index(node)
    raise click.BadParameter(f"no node {node!r}: 1 to {cluster.size}, or one of {', '.join(names)}")


def describe(started: LocalBroker | LocalCluster) -> None:
    rabbitmq = (started if isinstance(started, LocalBroker) else started.nodes[0]).rabbitmq
    click.echo(f"RabbitMQ {rabbitmq.version}" + ("" if rabbitmq.on_the_machine else f" (from {rabbitmq.root})"))
    if isinstance(started, LocalBroker):
        click.echo(f"broker running: {started.url}")
        click.echo(f"management UI:  {started.management_url}/ (guest/guest)")
        management = started.management_url
    else:
        for index, node in enumerate(started.nodes):
            state = "running" if node.is_running() else "down"
            click.echo(f"node {index + 1} {started.node_name(index)} ({state}): {node.url}  UI {node.management_url}/")
        click.echo(f"multi-host URL for apps: {started.url}")
        management = started.nodes[0].management_url
    click.echo("for apps made without a broker_url, and for amqp-events run elsewhere:")
    click.echo(f"  export AMQP_EVENTS_BROKER_URL='{started.url}' AMQP_EVENTS_MANAGEMENT_URL={management}")


@broker.command("start")
@directory_option
@click.option("--port", type=int, help="AMQP port of a single node (default: 5672 when free, else a free one).")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes in one cluster.")
@click.option(
    "--rabbitmq",
    envvar="AMQP_EVENTS_RABBITMQ",
    help="The RabbitMQ line (3.10, 4.0) or the root of an installation to run; default: the machine's own.",
)
@expecting(LocalServerError)
def broker_start(directory: Path, port: int | None, nodes: int, rabbitmq: str | None) -> None:
    """Start the node or the cluster (it keeps running after this command) and print its URLs."""
    if port is None and nodes == 1 and port_is_free(AMQP_PORT):
        port = AMQP_PORT
    installation = find(rabbitmq)
    started = (
        LocalCluster(directory, nodes, rabbitmq=installation)
        if nodes > 1
        else LocalBroker(directory, port, rabbitmq=installation)
    )
    started.start()
    for node in nodes_of(started):
        if node.state is not None:  # found from any directory (the console, `topology check`, `broker status`)
            registry.remember(node.state.amqp_port, directory)
    describe(started)


@broker.command("stop")
@directory_option
@expecting(LocalServerError)
def broker_stop(directory: Path) -> None:
    """Stop the node (or every node of the cluster) and everything it started."""
    started = started_in(directory)
    was_running = started.is_running()
    ports = [node.state.amqp_port for node in nodes_of(started) if node.state is not None]
    started.stop()
    for port in ports:
        registry.forget(port)
    click.echo("broker stopped" if was_running else "broker was not running")


@broker.command("status")
@directory_option
@click.pass_context
def broker_status(context: click.Context, directory: Path) -> None:
    """Say whether the node (or the cluster) runs, or without --dir any started elsewhere; exit status 3 when
    nothing does."""
    started = started_in(directory)
    if started.is_running():
        describe(started)
        return
    click.echo(f"no broker running in {directory}")
    elsewhere = running_elsewhere() if context.get_parameter_source("directory") is ParameterSource.DEFAULT else []
    for found in elsewhere:
        click.echo(f"\nstarted in {found.directory.resolve()}:")
        describe(found)
    if not elsewhere:
        raise SystemExit(3)


@broker.command("ctl", context_settings={"ignore_unknown_options": True})
@directory_option
@click.option("--port", type=int, default=AMQP_PORT, show_default=True, help="The AMQP port of the node.")
@click.argument("arguments", nargs=-1, type=click.UNPROCESSED, required=True)
@expecting(LocalServerError)
def broker_ctl(directory: Path, port: int, arguments: tuple[str, ...]) -> None:
    """Run ``rabbitmqctl ARGUMENTS`` against the local node serving ``--port`` (started in ``--dir``, or by
    ``broker start`` anywhere), with its own Erlang cookie, home and ports:
    ``amqp-events broker ctl list_users``."""
    node = node_for(port, directory)
    if node is None:
        raise LocalServerError(f"no node started by `amqp-events broker start` serves port {port}")
    click.echo(node.rabbitmqctl(*arguments), nl=False)


@broker.command("kill")
@click.argument("node")
@directory_option
@expecting(LocalServerError)
def broker_kill(node: str, directory: Path) -> None:
    """SIGKILL one node of the cluster (its number or its name), as a power cut would."""
    cluster = cluster_in(directory)
    index = node_of(cluster, node)
    cluster.kill(index)
    click.echo(f"killed node {index + 1}")


@broker.command("restart")
@click.argument("node")
@directory_option
@expecting(LocalServerError)
def broker_restart(node: str, directory: Path) -> None:
    """Stop one node of the cluster gracefully (if it runs), start it again, wait until the cluster has it back."""
    cluster = cluster_in(directory)
    index = node_of(cluster, node)
    cluster.restart(index)
    click.echo(f"node {index + 1} is back")


@broker.command("partition")
@click.argument("nodes", nargs=-1, required=True)
@directory_option
@expecting(LocalServerError)
def broker_partition(nodes: tuple[str, ...], directory: Path) -> None:
    """Cut NODES (numbers or names) off from the other nodes of the cluster, as a network split would (needs root
    and nftables). The side without a majority pauses (pause_minority); `broker heal` joins them again."""
    cluster = cluster_in(directory)
    indices = [node_of(cluster, node) for node in nodes]
    cluster.partition(*indices)
    click.echo(f"cut node(s) {', '.join(str(index + 1) for index in indices)} off from the others")


@broker.command("heal")
@directory_option
@expecting(LocalServerError)
def broker_heal(directory: Path) -> None:
    """Undo `broker partition`."""
    click.echo("healed" if cluster_in(directory).heal() else "the cluster was not cut")


@broker.command("install")
@click.argument("line", type=click.Choice(sorted(DEBIAN_RELEASES)))
@expecting(LocalServerError)
def broker_install(line: str) -> None:
    """Install Debian's RabbitMQ LINE beside the machine's own (needs root and debootstrap), for
    `broker start --rabbitmq LINE` and the test suite (AMQP_EVENTS_RABBITMQ=LINE)."""
    for found in installed():
        if found.line == line:
            click.echo(f"RabbitMQ {found.version} is installed" + ("" if found.on_the_machine else f" in {found.root}"))
            return
    install(line, echo=click.echo)
