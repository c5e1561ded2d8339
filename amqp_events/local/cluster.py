"""A private RabbitMQ cluster of several nodes on loopback (development and tests only).

Each node is a :class:`~amqp_events.local.broker.LocalBroker` in a
directory of its own with its own loopback address (``127.x.y.1``, ``.2``,
...: what :mod:`~amqp_events.local.partition` cuts apart), node name and
ports; the nodes share one Erlang cookie (a common HOME) and one epmd, which
the cluster runs. The first node starts alone; the others start, then join it. The whole layout is
saved in ``cluster.json`` so that ``amqp-events broker status|stop|kill|restart``
work from another process.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from amqp_events.errors import LocalServerError, ManagementError
from amqp_events.local import partition as cutting
from amqp_events.local import processes
from amqp_events.local.broker import LocalBroker
from amqp_events.local.installation import Installation, find
from amqp_events.transport.management import ManagementAPI

logger = logging.getLogger(__name__)

CLUSTER_CONFIG = {
    # Leaders of new quorum queues spread over the nodes (the default puts them on the declaring client's node).
    "queue_leader_locator": "balanced",
    # A node cut off from the majority pauses and closes its clients' connections: they move to the majority.
    "cluster_partition_handling": "pause_minority",
    # A cut is noticed within 8-12 s rather than the default 45-75 s.
    "net_ticktime": "10",
}


class LocalCluster:
    """``size`` nodes whose state lives in ``directory``.

    >>> cluster = LocalCluster(Path(".amqp-events/cluster"), 3)
    >>> cluster.start()              # doctest: +SKIP
    >>> cluster.url                  # doctest: +SKIP
    'amqp://guest:guest@127.0.0.1:40123//;amqp://guest:guest@127.0.0.1:40124//;...'
    >>> cluster.kill(0)              # doctest: +SKIP  (a power cut of the first node)
    """

    def __init__(
        self,
        directory: Path | str,
        size: int = 3,
        config: dict[str, str] | None = None,
        rabbitmq: Installation | None = None,
    ) -> None:
        self.directory = Path(directory).absolute()
        saved = self._load()
        self.size = int(saved.get("size", size))
        self.epmd_port = int(saved.get("epmd_port") or processes.free_port())
        self.epmd_pid = int(saved.get("epmd_pid", 0))
        self.epmd_started = int(saved.get("epmd_started", 0))
        self.joined = bool(saved.get("joined", False))
        #: The nodes' addresses are ``{network}.1``, ``{network}.2``, ...: a network of its own on loopback.
        self.network = str(saved.get("network") or f"127.{random.randint(1, 254)}.{random.randint(1, 254)}")
        root = saved.get("rabbitmq_root")
        self.requested_rabbitmq = Installation(Path(root)) if root else rabbitmq
        home = self.directory / "home"
        self.nodes = [
            LocalBroker(self.directory / f"node{n + 1}", config={**CLUSTER_CONFIG, **(config or {})},
                        epmd_port=self.epmd_port, home=home, rabbitmq=self.requested_rabbitmq,
                        host=f"{self.network}.{n + 1}")
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
        rabbitmq = self.requested_rabbitmq = self.requested_rabbitmq or find()
        rabbitmq.check()
        for node in self.nodes:
            node.requested_rabbitmq = rabbitmq
        if not processes.alive(processes.same(self.epmd_pid, self.epmd_started)):
            argv, environment = rabbitmq.command("epmd", ["-port", str(self.epmd_port)], os.environ)
            self.epmd_pid = processes.spawn(argv, environment, self.directory, self.directory / "epmd.out")
            self.epmd_started = processes.start_ticks(self.epmd_pid)
        self._save()
        try:
            self._start_nodes(timeout)
        except BaseException:
            self.stop()  # no node left running that nobody will stop
            raise

    def _start_nodes(self, timeout: float) -> None:
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
        """Until ``nodes`` (all) nodes run the RabbitMQ application, as the cluster itself reports it, and the
        management API of each node running answers (a node back from a pause lists itself running a moment
        before its management listener is up again)."""
        wanted = self.size if nodes is None else nodes
        deadline = time.monotonic() + timeout
        running: list[str] = []
        silent: dict[int, float] = {}  # since when each node the cluster lists running has not answered
        while time.monotonic() < deadline:
            for node in self.nodes:
                if not node.is_running():
                    continue
                try:
                    status = json.loads(node.rabbitmqctl("cluster_status", "--formatter", "json", timeout=30))
                except (LocalServerError, ValueError, subprocess.TimeoutExpired):
                    continue
                running = status.get("running_nodes", [])
                if len(running) >= wanted and self._management_answers(silent):
                    return
                break
            time.sleep(0.5)
        unanswered = [self.node_name(index) for index in silent]
        tails = "".join(f"\n--- {self.node_name(index)}:\n{self.nodes[index].log_tail(15)}" for index in silent)
        raise LocalServerError(
            f"{wanted} node(s) not running after {timeout:g}s (running: {running}; management API not answering: "
            f"{unanswered or 'none'}){tails}"
        )

    def _management_answers(self, silent: dict[int, float]) -> bool:
        """Whether the management API of each running node answers. One that the cluster lists running but that
        has not answered for :data:`MANAGEMENT_GRACE` seconds is restarted, once: a node back from a pause
        (pause_minority) has come back without its management listener, and once with an application whose
        ``stop_app`` hung too (RabbitMQ 3.10 stuck in its boot after the heal): then the node is killed and started."""
        answering = True
        for index, node in enumerate(self.nodes):
            if not node.is_running() or _answers(node):
                silent.pop(index, None)
                continue
            answering = False
            since = silent.setdefault(index, time.monotonic())
            if since > 0 and time.monotonic() - since > MANAGEMENT_GRACE:
                logger.warning(
                    "node %s runs but its management API has not answered for %d s: restarting its application\n%s",
                    self.node_name(index), MANAGEMENT_GRACE, node.log_tail(15),
                )  # fmt: skip
                silent[index] = 0.0  # once
                try:
                    node.rabbitmqctl("stop_app", timeout=30)
                    node.rabbitmqctl("start_app", timeout=120)
                except (LocalServerError, subprocess.TimeoutExpired) as exc:
                    # Its data is safe on disk and on the majority: a power cut and a start is what an operator does.
                    logger.warning("node %s did not restart its application (%s): killing and starting it",
                                   self.node_name(index), exc)  # fmt: skip
                    node.kill()
                    node.start()
        return answering

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

    def partition(self, *indices: int) -> None:
        """Cut the nodes ``indices`` (0-based) off from the others (:mod:`~amqp_events.local.partition`)."""
        cutting.cut(self.network, indices, self.size)

    def heal(self) -> bool:
        """Undo :meth:`partition`; returns whether the cluster was cut."""
        return cutting.heal(self.network)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop every node (healing a partition first), then the cluster's epmd."""
        self.heal()
        with ThreadPoolExecutor(self.size) as pool:
            list(pool.map(lambda node: node.stop(timeout), reversed(self.nodes)))
        processes.terminate(processes.same(self.epmd_pid, self.epmd_started), 10.0)
        self.epmd_pid = self.epmd_started = 0
        self._save()

    def _load(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.directory / "cluster.json").read_text()))
        except (OSError, ValueError):
            return {}

    def _save(self) -> None:
        layout = {
            "size": self.size,
            "epmd_port": self.epmd_port,
            "epmd_pid": self.epmd_pid,
            "epmd_started": self.epmd_started,
            "joined": self.joined,
            "network": self.network,
            "rabbitmq_root": str(self.requested_rabbitmq.root) if self.requested_rabbitmq else None,
        }
        (self.directory / "cluster.json").write_text(json.dumps(layout, indent=2))


#: Seconds a node listed running may go without its management API answering before its application restarts.
MANAGEMENT_GRACE = 45


def _answers(node: LocalBroker) -> bool:
    try:
        node.management.request("GET", "/api/overview")
    except ManagementError:
        return False
    return True
