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
With ``partition``, the nodes are instead cut off from the others in rotation
(a network partition, :mod:`amqp_events.local.partition`), then healed.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import Engine, create_engine

from amqp_events import PublishError, events_app
from amqp_events.inbox.sql import InboxTable
from amqp_events.local.broker import LocalBroker
from amqp_events.local.cluster import LocalCluster
from amqp_events.local.postgres import LocalPostgres
from amqp_events.testing import wait_for
from amqp_events.testing.workers import WorkerProcess, worker_argv
from faults import effects, probes
from faults.audit import audit, count_effects
from faults.chaos import Chaos, NodeRotation, StrandedDeadLetters, crash_broker, restart
from faults.plan import KINDS, SERVICES, poison_of
from faults.report import Report

ROOT = Path(__file__).resolve().parent.parent
POOLS = (("prefork", 2), ("solo", 1))


def run(
    events: int,
    workdir: Path,
    duration: float,
    seed: int = 7,
    deadline: float = 300,
    outbox: bool = False,
    inbox: bool = False,
    cluster: int = 0,
    partition: bool = False,
    kills: int = 5,
    node_faults: int = 2,
) -> Report:
    """One full fault-injection run (firing through the outbox, handling through the inbox, on a cluster of
    ``cluster`` nodes, cut off in rotation with ``partition``); returns the audit.

    The faults go on after the last event was fired until at least ``kills`` processes were SIGKILLed and (on a
    cluster) ``node_faults`` nodes failed, however slowly a loaded machine restarts them.
    """
    rng = random.Random(seed)
    report = Report(events, outbox=outbox, inbox=inbox, cluster=cluster, partition=partition)
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
    report.rabbitmq = (node if isinstance(node, LocalBroker) else node.nodes[0]).rabbitmq.version or ""
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
        rotation = NodeRotation(node, rng, partition) if isinstance(node, LocalCluster) else None
        if rotation is not None:
            rotation.start()
        committed = fire_under_chaos(url, events, duration, node, report, database if outbox else None)
        wait_for(
            lambda: sum(chaos.kills.values()) >= kills and (rotation is None or rotation.faults >= node_faults),
            deadline,
            what=f"{kills} processes killed and {node_faults} node faults",
        )
        if rotation is not None:
            rotation.halt.set()
            rotation.join()
            report.node_faults = rotation.faults
        chaos.halt.set()
        chaos.join()
        report.worker_kills, report.relay_kills = chaos.kills["worker"], chaos.kills["relay"]
        for processes in (workers, relays):
            for index, process in enumerate(processes):
                if not process.is_running():
                    processes[index] = restart(process)
        unstick = None
        if isinstance(node, LocalCluster):
            unstick = StrandedDeadLetters(node, "faults", report.stranded_restarts)
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
            if crash is not None:  # the outbox does not wait for the broker: the probes must not find it down
                crash.join()
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
