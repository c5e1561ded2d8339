"""The fault-injection run: 3 services, 6 workers, a producer under chaos; then an audit of every event.

While a producer fires ``events`` events (3 kinds, every service subscribed
to all of them), a chaos thread SIGKILLs a random worker (its whole process
group) every 2-4 seconds and restarts it, the RabbitMQ node is killed hard
once and restarted, and bad input is published. Handlers fail 20% of runs at
random; a known set of events is poison. Then, within a bounded wait, the
audit checks that every confirmed (event, service) pair was handled, that
each service's archive holds exactly its poison events and the bad input,
and that no message is left in a main or delay queue.

In outbox mode the producer writes each event in a PostgreSQL transaction of
its own through ``app.outbox`` (every tenth one rolls back), two relay
processes publish the rows and are SIGKILLed and restarted by the chaos
thread like the workers; the audit also checks that no event of a rolled-back
transaction reached any service and that the outbox is empty.

In inbox mode every handler writes its effect to PostgreSQL through the
inbox (``faults/service.py``); the audit then counts effects, not runs: each
(event, service) pair must have exactly one.

In cluster mode the broker is a cluster of three nodes; instead of one crash,
the nodes are SIGKILLed in rotation (down a few seconds each, then restarted)
while the workers are killed as usual; every client has every node's URL.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine, create_engine

from amqp_events import PublishError, events_app
from amqp_events.inbox.sql import InboxTable
from amqp_events.local.broker import LocalBroker
from amqp_events.local.cluster import LocalCluster
from amqp_events.management import ManagementAPI
from amqp_events.testing import json_lines
from amqp_events.testing.postgres import LocalPostgres
from amqp_events.testing.workers import WorkerProcess, worker_argv
from faults import effects, probes

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ("alpha", "beta", "gamma")
KINDS = ("fault.a", "fault.b", "fault.c")
POOLS = (("prefork", 2), ("solo", 1))


def poison_of(seq: int) -> str:
    """The poison events: every 97th, alternately failing until out of retries and non-retryable."""
    if seq % 97 != 13:
        return ""
    return "retry" if (seq // 97) % 2 else "permanent"


@dataclass
class Report:
    events: int
    outbox: bool = False
    inbox: bool = False
    cluster: int = 0
    node_kills: int = 0
    duplicate_effects: int = 0
    skipped_duplicates: int = 0
    confirmed: int = 0
    rolled_back: int = 0
    phantoms: list[int] = field(default_factory=list)
    fire_errors: int = 0
    expected_pairs: int = 0
    handled_pairs: int = 0
    handler_runs: int = 0
    duplicate_handled: int = 0
    lost: list[tuple[int, str]] = field(default_factory=list)
    archived: Counter[str] = field(default_factory=Counter)
    archive_duplicates: int = 0
    archive_missing: list[str] = field(default_factory=list)
    archive_unexpected: list[str] = field(default_factory=list)
    leftover: dict[str, int] = field(default_factory=dict)
    worker_kills: int = 0
    relay_kills: int = 0
    outbox_left: int = 0
    broker_restarts: int = 0
    #: Leaders restarted to send on dead letters a node loss stranded (RabbitMQ 3.10; RELIABILITY.md).
    stranded_restarts: list[str] = field(default_factory=list)
    bad_inputs: int = 0
    refused_bad_inputs: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.archive_missing or self.archive_unexpected or self.leftover or self.phantoms
        ) and not (self.outbox_left or self.duplicate_effects)

    def table(self) -> str:
        fired = [("events fired (confirmed by the broker)", self.confirmed)]
        if self.outbox:
            fired = [
                ("events committed through the outbox (one transaction each)", self.confirmed),
                ("transactions rolled back after firing", self.rolled_back),
                ("events of rolled-back transactions handled (must be 0)", len(self.phantoms)),
                ("rows left in the outbox (must be 0)", self.outbox_left),
                ("relay processes SIGKILLed and restarted", self.relay_kills),
            ]
        effects = [
            ("duplicate deliveries the inbox skipped", self.skipped_duplicates),
            ("duplicate effects: pairs with more than one committed effect (must be 0)", self.duplicate_effects),
        ]
        rows = [
            *fired,
            *(effects if self.inbox else []),
            ("firing attempts that raised (broker down), then retried", self.fire_errors),
            ("(event, service) pairs to handle (poison excluded)", self.expected_pairs),
            ("pairs handled", self.handled_pairs),
            ("handler runs, failures and retries included", self.handler_runs),
            ("duplicate successful runs (at-least-once)", self.duplicate_handled),
            ("archived, by reason", dict(sorted(self.archived.items()))),
            ("duplicate archive entries", self.archive_duplicates),
            ("lost (must be 0)", len(self.lost)),
            ("missing from the archive (must be 0)", len(self.archive_missing)),
            ("archived unexpectedly (must be 0)", len(self.archive_unexpected)),
            ("messages left in main or delay queues (must be none)", self.leftover or "none"),
            ("worker processes SIGKILLed and restarted", self.worker_kills),
            ("broker crashes (SIGKILL) and restarts", self.broker_restarts),
            *([("cluster nodes SIGKILLed in rotation, then restarted", self.node_kills)] if self.cluster else []),
            *(
                [("leaders restarted to free stranded dead letters (RabbitMQ 3.10)", self.stranded_restarts or "none")]
                if self.cluster
                else []
            ),
            ("bad inputs published", self.bad_inputs),
            ("bad inputs the broker refused at publish time", self.refused_bad_inputs),
            ("duration (s)", round(self.seconds)),
        ]
        return "\n".join(f"| {label} | {value} |" for label, value in rows)


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


def run(
    events: int,
    workdir: Path,
    duration: float,
    seed: int = 7,
    deadline: float = 300,
    outbox: bool = False,
    inbox: bool = False,
    cluster: int = 0,
) -> Report:
    """One full fault-injection run (firing through the outbox, handling through the inbox, on a cluster of
    ``cluster`` nodes); returns the audit."""
    rng = random.Random(seed)
    report = Report(events, outbox=outbox, inbox=inbox, cluster=cluster)
    started = time.monotonic()
    config = {"max_message_size": str(probes.MAX_MESSAGE_SIZE)}
    node = (
        LocalCluster(workdir / "cluster", cluster, config)
        if cluster
        else LocalBroker(workdir / "broker", config=config)
    )
    postgres = LocalPostgres().start() if outbox or inbox else None
    database = create_engine(postgres.create_database("faults")) if postgres is not None else None
    node.start()
    workers: list[WorkerProcess] = []
    relays: list[WorkerProcess] = []
    try:
        node.management.create_vhost("faults")
        url = node.vhost_url("faults")
        journal = workdir / "journal.jsonl"
        journal.touch()
        env = {**os.environ, "BROKER_URL": url, "JOURNAL": str(journal), "PYTHONPATH": str(ROOT)}
        env["TMPDIR"] = str(workdir)  # what a SIGKILLed worker leaves behind goes with the run
        if inbox and database is not None:
            env["INBOX_DB"] = database.url.render_as_string(False)
            effects.metadata.create_all(database)
            InboxTable(database).create()
        for service in SERVICES:
            for pool, concurrency in POOLS:
                argv = worker_argv("faults.service", pool=pool, concurrency=concurrency, name=f"{service}-{pool}")
                log = workdir / f"{service}-{pool}.log"
                workers.append(WorkerProcess(argv, {**env, "SERVICE": service}, ROOT, log).start())
        if outbox and database is not None:
            events_app("loadgen").outbox_store(engine=database).create()
            for n in range(2):
                argv = [sys.executable, "-m", "amqp_events.cli", "-A", "faults.service", "outbox", "relay",
                        "--db", database.url.render_as_string(False), "--lease", "5"]  # fmt: skip
                relays.append(WorkerProcess(argv, {**env, "SERVICE": "alpha"}, ROOT, workdir / f"relay{n}.log").start())
        for worker in workers:
            worker.wait_ready(120)
        time.sleep(3)  # RabbitMQ 3.10 can lose a quorum queue declared ~2 s before a crash (RELIABILITY.md)

        chaos = Chaos(workers, relays, rng)
        chaos.start()
        rotation = NodeRotation(node, rng) if isinstance(node, LocalCluster) else None
        if rotation is not None:
            rotation.start()
        committed = fire_under_chaos(url, events, duration, node, report, database if outbox else None)
        if rotation is not None:
            rotation.halt.set()
            rotation.join()
            report.node_kills = rotation.kills
        chaos.halt.set()
        chaos.join()
        report.worker_kills, report.relay_kills = chaos.kills["worker"], chaos.kills["relay"]
        for processes in (workers, relays):
            for index, process in enumerate(processes):
                if not process.is_running():
                    processes[index] = restart(process)
        unstick = StrandedDeadLetters(node, report) if isinstance(node, LocalCluster) else None
        audit(url, node.management, journal, committed, report, deadline, database if outbox else None, unstick)
        if inbox and database is not None:
            count_effects(database, committed, report)
            report.skipped_duplicates = sum(
                log.read_text().count("duplicate skipped") for log in workdir.glob("*-*.log")
            )
    finally:
        for process in [*workers, *relays]:
            process.stop()
        node.stop()
        if postgres is not None:
            postgres.stop()
    report.seconds = time.monotonic() - started
    return report


class NodeRotation(threading.Thread):
    """Cluster mode: every 8-12 s SIGKILL the next node, keep it down 4 s, start it again."""

    def __init__(self, cluster: LocalCluster, rng: random.Random) -> None:
        super().__init__(daemon=True, name="node-rotation")
        self.cluster, self.rng = cluster, rng
        self.kills = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.rng.uniform(8, 12)):
            index = self.kills % self.cluster.size
            self.cluster.kill(index)
            self.kills += 1
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


def fire_under_chaos(
    url: str, events: int, duration: float, node: LocalBroker | LocalCluster, report: Report, database: Engine | None
) -> dict[int, str]:
    """Fire ``events`` events over ``duration`` seconds; crash the broker at 40%, send bad input at 70%.

    Returns the events that count: confirmed by the broker, or committed to the outbox.
    """
    app = events_app("loadgen", broker_url=url, amqp_events_publish_timeout=3)
    fired: dict[int, str] = {}
    interval = duration / events
    start = time.monotonic()
    crash: threading.Thread | None = None
    for seq in range(events):
        time.sleep(max(0.0, start + seq * interval - time.monotonic()))
        if seq == int(events * 0.4) and isinstance(node, LocalBroker):  # a cluster's nodes die in rotation
            crash = crash_broker(node, report, down=6)
        if seq == int(events * 0.7):
            send_probes(url, report)
        payload = {"seq": seq, "poison": poison_of(seq)}
        if database is not None:
            if write_in_transaction(app, database, seq, payload):
                fired[seq] = "committed"
            continue
        event_id = None  # fired again under the same id: a copy that did arrive is the same event to the inbox
        while seq not in fired:
            try:
                fired[seq] = app.fire(KINDS[seq % 3], [], payload, event_id=event_id)
            except PublishError as exc:
                report.fire_errors += 1  # raised within the publish timeout: fire again
                event_id = exc.event_ids[0]
                time.sleep(0.5)
    if crash is not None:
        crash.join()
    app.close()
    report.confirmed = len(fired)
    report.rolled_back = events - len(fired)
    return fired


class RolledBack(Exception):
    pass


def write_in_transaction(app: object, database: Engine, seq: int, payload: dict) -> bool:
    """A request: fire in a transaction of its own through the outbox; every tenth one rolls back."""
    try:
        with database.begin() as connection, app.outbox(connection):  # type: ignore[attr-defined]
            app.fire(KINDS[seq % 3], [], payload)  # type: ignore[attr-defined]
            if seq % 10 == 7:
                raise RolledBack
    except RolledBack:
        return False
    return True


def send_probes(url: str, report: Report) -> None:
    def refused(probe: probes.Probe, exc: Exception) -> None:
        report.refused_bad_inputs += 1

    for probe in probes.PROBES:
        probes.publish(url, probe, refused)
        report.bad_inputs += 1


def audit(
    url: str,
    management: ManagementAPI,
    journal: Path,
    confirmed: dict[int, str],
    report: Report,
    deadline: float,
    database: Engine | None = None,
    unstick: StrandedDeadLetters | None = None,
) -> None:
    """Wait (bounded) until every event reached its end, then record what is missing or left over."""
    app = events_app("auditor", broker_url=url)
    outbox = app.outbox_store(engine=database) if database is not None else None
    expected_handled = {(seq, service) for seq in confirmed if not poison_of(seq) for service in SERVICES}
    expected_archive = {f"{service}:{seq}" for seq in confirmed if poison_of(seq) for service in SERVICES} | {
        f"{service}:{probe.name}" for probe in probes.PROBES if probe.reason for service in SERVICES
    }
    report.expected_pairs = len(expected_handled)
    end = time.monotonic() + deadline
    while True:
        runs = json_lines(journal)
        handled = Counter((run["seq"], run["service"]) for run in runs if run["outcome"] == "ok")
        archived_keys, reasons = archive_contents(app)
        leftover = leftover_messages(management, "faults")
        outbox_left = outbox.stats().pending if outbox is not None else 0
        settled = expected_handled <= set(handled) and expected_archive <= set(archived_keys) and not leftover
        if (settled and not outbox_left) or time.monotonic() > end:
            break
        if unstick is not None:
            unstick.look(management)
        time.sleep(2)
    time.sleep(6)  # the management API's queue counts lag by up to 5 s: look once more
    leftover = leftover_messages(management, "faults")
    report.handler_runs = len(runs)
    report.handled_pairs = len(expected_handled & set(handled))
    report.duplicate_handled = sum(count - 1 for count in handled.values())
    report.lost = sorted(expected_handled - set(handled))
    report.archived = reasons
    report.archive_duplicates = sum(count - 1 for count in archived_keys.values())
    report.archive_missing = sorted(expected_archive - set(archived_keys))
    report.archive_unexpected = sorted(set(archived_keys) - expected_archive)
    report.leftover = leftover
    report.outbox_left = outbox.stats().pending if outbox is not None else 0
    rolled_back = {seq for seq in range(report.events) if seq not in confirmed} if outbox is not None else set()
    report.phantoms = sorted({run["seq"] for run in runs} & rolled_back)
    app.close()


class StrandedDeadLetters:
    """The operator's remedy for RabbitMQ 3.10's stranded dead letters (RELIABILITY.md), applied as documented.

    After a node loss, a quorum queue's at-least-once dead-lettering can keep
    messages (``messages_dlx``) waiting forever for a confirm from a target
    queue. They are not lost: restarting the node that leads the source
    queue starts a new dead-letter worker, which sends them on. Restart it
    when the count has not moved for ``patience`` seconds.
    """

    def __init__(self, cluster: LocalCluster, report: Report, patience: float = 30.0) -> None:
        self.cluster, self.report, self.patience = cluster, report, patience
        self.seen: dict[str, tuple[int, float]] = {}

    def look(self, management: ManagementAPI) -> None:
        now = time.monotonic()
        held = {queue["name"]: queue for queue in management.queues("faults") if queue.get("messages_dlx")}
        self.seen = {
            name: self.seen[name] if name in self.seen and self.seen[name][0] == queue["messages_dlx"]
            else (queue["messages_dlx"], now)
            for name, queue in held.items()
        }  # fmt: skip
        stuck = {held[name].get("leader") for name, (_, since) in self.seen.items() if now - since > self.patience}
        for index in range(self.cluster.size):
            if self.cluster.node_name(index) in stuck:
                self.report.stranded_restarts.append(self.cluster.node_name(index))
                self.cluster.restart(index)
                self.seen.clear()


def archive_contents(app: object) -> tuple[Counter[str], Counter[str]]:
    """``service:seq`` (or ``service:probe``) of every archived message, and the count per reason."""
    keys: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for service in SERVICES:
        for entry in app.archive(service).list():
            probe = entry.headers.get("fault_probe")
            payload = entry.payload
            seq = payload[1].get("seq") if isinstance(payload, list) and len(payload) > 1 else None
            keys[f"{service}:{probe if probe else seq}"] += 1
            reasons[entry.reason] += 1
    return keys, reasons


def leftover_messages(management: ManagementAPI, vhost: str) -> dict[str, int]:
    """Messages (ready or unacked) in any queue but the archives and Celery's remote-control queues."""
    return {
        queue["name"]: queue.get("messages", 0)
        for queue in management.queues(vhost)
        if queue.get("messages", 0) and not queue["name"].endswith(".archive") and "pidbox" not in queue["name"]
    }


def count_effects(database: Engine, committed: dict[int, str], report: Report) -> None:
    """Inbox mode: the handled pairs are the committed effects; more than one for a pair is a duplicate effect."""
    from sqlalchemy import func, select

    columns = effects.effects.c
    pairs = (columns.seq, columns.service)
    with database.connect() as connection:
        counts = {(seq, name): n for seq, name, n in connection.execute(select(*pairs, func.count()).group_by(*pairs))}
    expected = {(seq, name) for seq in committed if not poison_of(seq) for name in SERVICES}
    report.handled_pairs = len(expected & set(counts))
    report.lost = sorted(expected - set(counts))
    report.duplicate_effects = sum(n - 1 for n in counts.values())
