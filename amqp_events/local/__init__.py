"""Private, throwaway servers for development: a RabbitMQ node (:mod:`~amqp_events.local.broker`) or a cluster
of them (:mod:`~amqp_events.local.cluster`), each in a directory of its own. ``amqp-events broker`` and the test
harness start them; nothing in a producer or a worker imports this package."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

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
    """The management API of the local node (started in ``directory``) that serves ``amqp_url``, if one does."""
    if not directory.exists():
        return None
    started = started_in(directory)
    nodes = started.nodes if isinstance(started, LocalCluster) else [started]
    port = urllib.parse.urlsplit(amqp_url.split(";")[0]).port or AMQP_PORT
    for node in nodes:
        if node.state is not None and node.state.amqp_port == port and node.is_running():
            return node.management_url
    return None
