"""Private, throwaway servers for development: a RabbitMQ node (:mod:`~amqp_events.local.broker`) or a cluster
of them (:mod:`~amqp_events.local.cluster`), PostgreSQL (:mod:`~amqp_events.local.postgres`) and Redis
(:mod:`~amqp_events.local.redis`), each in a directory of its own. ``amqp-events broker`` and the test fixtures
start them; nothing in a producer or a worker imports this package."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from amqp_events.local import registry
from amqp_events.local.broker import LocalBroker
from amqp_events.local.cluster import LocalCluster

#: Where ``amqp-events broker start`` keeps its node, relative to the current directory.
DEFAULT_DIRECTORY = Path(".amqp-events/broker")
#: RabbitMQ's own port: a node started without --port takes it when it is free, so that apps find it as written.
AMQP_PORT = 5672


def started_in(directory: Path) -> LocalBroker | LocalCluster:
    """What was started in ``directory``: a cluster (``cluster.json``) or a single node."""
    return LocalCluster(directory) if (directory / "cluster.json").exists() else LocalBroker(directory)


def management_url_for(amqp_url: str, directory: Path = DEFAULT_DIRECTORY) -> str | None:
    """The management API of the local node that serves ``amqp_url``, if one does (see :func:`node_for`)."""
    node = node_for(urllib.parse.urlsplit(amqp_url.split(";")[0]).port or AMQP_PORT, directory)
    return node.management_url if node is not None else None


def node_for(port: int = AMQP_PORT, directory: Path = DEFAULT_DIRECTORY) -> LocalBroker | None:
    """The local node that serves AMQP on ``port``, if one does: the one started in ``directory``, else one
    ``amqp-events broker start`` started anywhere (:mod:`~amqp_events.local.registry`)."""
    for place in (directory, registry.noted().get(port)):
        node = _node_serving(place, port) if place is not None and place.exists() else None
        if node is not None:
            return node
    return None


def running_elsewhere() -> list[LocalBroker | LocalCluster]:
    """What ``amqp-events broker start`` started anywhere that still runs (notes of stopped ones removed)."""
    found: dict[Path, LocalBroker | LocalCluster] = {}
    for port, directory in registry.noted().items():
        if directory.exists() and _node_serving(directory, port) is not None:
            found.setdefault(directory, started_in(directory))
        else:
            registry.forget(port)
    return list(found.values())


def nodes_of(started: LocalBroker | LocalCluster) -> list[LocalBroker]:
    """The nodes of what was started: a cluster's, or the single node itself."""
    return started.nodes if isinstance(started, LocalCluster) else [started]


def _node_serving(directory: Path, port: int) -> LocalBroker | None:
    for node in nodes_of(started_in(directory)):
        if node.state is not None and node.state.amqp_port == port and node.is_running():
            return node
    return None
