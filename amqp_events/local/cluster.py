"""A private RabbitMQ cluster of several nodes on loopback (development and tests only).

Each node is a :class:`~amqp_events.testing.broker.LocalBroker` in a
directory of its own with its own node name and ports; the nodes share one
Erlang cookie (a common HOME) and one epmd, which the cluster runs. The
first node starts alone; the others start, then join it. The whole layout is
saved in ``cluster.json`` so that ``amqp-events broker status|stop|kill|restart``
work from another process.
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from amqp_events.errors import LocalServerError
from amqp_events.local.broker import LocalBroker, _alive, _terminate, free_port
from amqp_events.management import ManagementAPI

#: Leaders of new quorum queues spread over the nodes (the default puts them on the declaring client's node).
CLUSTER_CONFIG = {"queue_leader_locator": "balanced"}


class LocalCluster:
    """``size`` nodes whose state lives in ``directory``.

    >>> cluster = LocalCluster(Path(".amqp-events/cluster"), 3)
    >>> cluster.start()              # doctest: +SKIP
    >>> cluster.url                  # doctest: +SKIP
    'amqp://guest:guest@127.0.0.1:40123//;amqp://guest:guest@127.0.0.1:40124//;...'
    >>> cluster.kill(0)              # doctest: +SKIP  (a power cut of the first node)
    """

    def __init__(self, directory: Path | str, size: int = 3, config: dict[str, str] | None = None) -> None:
        self.directory = Path(directory).absolute()
        saved = self._load()
        self.size = int(saved.get("size", size))
        self.epmd_port = int(saved.get("epmd_port") or free_port())
        self.epmd_pid = int(saved.get("epmd_pid", 0))
        self.joined = bool(saved.get("joined", False))
        home = self.directory / "home"
        self.nodes = [
            LocalBroker(self.directory / f"node{n + 1}", config={**CLUSTER_CONFIG, **(config or {})},
                        epmd_port=self.epmd_port, home=home)
            for n in range(self.size)
        ]  # fmt: skip

    # -- what clients use -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Every node's URL of the default vhost, ``;``-separated (Celery's and kombu's failover syntax)."""
        return self.vhost_url("/")

    def vhost_url(self, vhost: str) -> str:
        return ";".join(node.vhost_url(vhost) for node in self.nodes)

    @property
    def management(self) -> ManagementAPI:
        """The management API of a running node."""
        for node in self.nodes:
            if node.is_running():
                return node.management
        raise LocalServerError("no node of the cluster runs")

    def is_running(self) -> bool:
        return any(node.is_running() for node in self.nodes)

    def node_name(self, index: int) -> str:
        state = self.nodes[index].state
        if state is None:
            raise LocalServerError(f"node {index + 1} has never been started")
        return state.nodename

    # -- running it -----------------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Start every node that is not running (joining them into one cluster the first time); wait for all."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if not _alive(self.epmd_pid):
            log = (self.directory / "epmd.out").open("ab")
            self.epmd_pid = subprocess.Popen(
                ["epmd", "-port", str(self.epmd_port)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            ).pid
        self._save()
        first, others = self.nodes[0], self.nodes[1:]
        first.start(timeout)
        with ThreadPoolExecutor(len(others) or 1) as pool:
            list(pool.map(lambda node: node.start(timeout), others))
        if not self.joined:
            for node in others:
                node.rabbitmqctl("stop_app")
                node.rabbitmqctl("join_cluster", self.node_name(0))
                node.rabbitmqctl("start_app")
            self.joined = True
            self._save()
        self.wait_until_running(timeout)

    def wait_until_running(self, timeout: float = 120.0, nodes: int | None = None) -> None:
        """Until ``nodes`` (all) nodes run the RabbitMQ application, as the cluster itself reports it."""
        wanted = self.size if nodes is None else nodes
        deadline = time.monotonic() + timeout
        running: list[str] = []
        while time.monotonic() < deadline:
            for node in self.nodes:
                if not node.is_running():
                    continue
                try:
                    status = json.loads(node.rabbitmqctl("cluster_status", "--formatter", "json", timeout=30))
                except (LocalServerError, ValueError, subprocess.TimeoutExpired):
                    continue
                running = status.get("running_nodes", [])
                if len(running) >= wanted:
                    return
                break
            time.sleep(0.5)
        raise LocalServerError(f"{wanted} node(s) not running after {timeout:g}s (running: {running})")

    def kill(self, index: int) -> None:
        """SIGKILL one node, as a power cut would."""
        self.nodes[index].kill()

    def restart(self, index: int, timeout: float = 120.0) -> None:
        """Stop one node gracefully (if it runs), start it again and wait until the cluster has it back."""
        node = self.nodes[index]
        if node.is_running():
            node.stop()
        node.start(timeout)
        self.wait_until_running(timeout)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop every node, then the cluster's epmd."""
        with ThreadPoolExecutor(self.size) as pool:
            list(pool.map(lambda node: node.stop(timeout), reversed(self.nodes)))
        _terminate(self.epmd_pid, 10.0)
        self.epmd_pid = 0
        self._save()

    def _load(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.directory / "cluster.json").read_text()))
        except (OSError, ValueError):
            return {}

    def _save(self) -> None:
        layout = {"size": self.size, "epmd_port": self.epmd_port, "epmd_pid": self.epmd_pid, "joined": self.joined}
        (self.directory / "cluster.json").write_text(json.dumps(layout, indent=2))
