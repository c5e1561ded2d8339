"""The faults a run injects: workers and relays SIGKILLed, the broker crashed, cluster nodes killed or cut off."""

from __future__ import annotations

import random
import threading
import time

from amqp_events.errors import ManagementError
from amqp_events.local.broker import LocalBroker
from amqp_events.local.cluster import LocalCluster
from amqp_events.testing.workers import WorkerProcess
from amqp_events.transport.management import ManagementAPI
from faults.report import Report


class Chaos(threading.Thread):
    """Every 2-4 s, SIGKILL a random worker's (or relay's) process group and start it again."""

    def __init__(self, workers: list[WorkerProcess], relays: list[WorkerProcess], rng: random.Random) -> None:
        super().__init__(daemon=True, name="chaos")
        self.processes, self.rng = {"worker": workers, "relay": relays}, rng
        self.kills = {"worker": 0, "relay": 0}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.rng.uniform(2, 4)):
            kind, index = self.rng.choice(
                [(kind, index) for kind, processes in self.processes.items() for index in range(len(processes))]
            )
            processes = self.processes[kind]
            processes[index].kill()
            processes[index] = restart(processes[index])
            self.kills[kind] += 1


def restart(worker: WorkerProcess) -> WorkerProcess:
    return WorkerProcess(worker.argv, worker.env, worker.cwd, worker.log_path).start()


class NodeRotation(threading.Thread):
    """Cluster mode: every 8-12 s SIGKILL the next node, keep it down 4 s, start it again; or (``partition``) cut
    the next node off from the others for 25 s (long enough for it to notice and pause), then heal."""

    def __init__(self, cluster: LocalCluster, rng: random.Random, partition: bool = False) -> None:
        super().__init__(daemon=True, name="node-rotation")
        self.cluster, self.rng, self.partition = cluster, rng, partition
        self.faults = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.rng.uniform(8, 12)):
            index = self.faults % self.cluster.size
            self.faults += 1
            if self.partition:
                self.cluster.partition(index)
                time.sleep(25)
                self.cluster.heal()
                self.cluster.wait_until_running()  # the paused node comes back by itself
            else:
                self.cluster.kill(index)
                time.sleep(4)
                self.cluster.start()  # the killed node comes back; the cluster waits until all run


def crash_broker(node: LocalBroker, report: Report, down: float) -> threading.Thread:
    """SIGKILL the node, keep it down ``down`` seconds (longer than the publish timeout), restart it."""

    def crash() -> None:
        node.kill()
        time.sleep(down)
        node.start()
        report.broker_restarts += 1

    thread = threading.Thread(target=crash, name="broker-crash")
    thread.start()
    return thread


class StrandedDeadLetters:
    """The operator's remedy for RabbitMQ 3.10's stranded dead letters (RELIABILITY.md), applied as documented.

    After a node loss, a quorum queue's at-least-once dead-lettering can keep
    messages (``messages_dlx``) waiting forever for a confirm from a target
    queue. They are not lost: restarting the node that leads the source
    queue starts a new dead-letter worker, which sends them on. Restart it
    when the count has not moved for ``patience`` seconds.
    """

    def __init__(self, cluster: LocalCluster, vhost: str, restarted: list[str], patience: float = 30.0) -> None:
        self.cluster, self.vhost, self.restarted, self.patience = cluster, vhost, restarted, patience
        self.seen: dict[str, tuple[int, float]] = {}

    def look(self, management: ManagementAPI) -> None:
        now = time.monotonic()
        try:
            queues = management.queues(self.vhost)
        except ManagementError:  # the node it asks is down or restarting (a partition healing): look again later
            return
        held = {queue["name"]: queue for queue in queues if queue.get("messages_dlx")}
        self.seen = {
            name: self.seen[name] if name in self.seen and self.seen[name][0] == queue["messages_dlx"]
            else (queue["messages_dlx"], now)
            for name, queue in held.items()
        }  # fmt: skip
        stuck = {held[name].get("leader") for name, (_, since) in self.seen.items() if now - since > self.patience}
        for index in range(self.cluster.size):
            if self.cluster.node_name(index) in stuck:
                self.restarted.append(self.cluster.node_name(index))
                self.cluster.restart(index)
                self.seen.clear()
