"""The fault-injection run: 3 services, 6 workers, a producer under chaos; then an audit of every event.

While a producer fires ``events`` events (3 kinds, every service subscribed
to all of them), a chaos thread SIGKILLs a random worker (its whole process
group) every 2-4 seconds and restarts it, the RabbitMQ node is killed hard
once and restarted, and bad input is published. Handlers fail 20% of runs at
random; a known set of events is poison. Then, within a bounded wait, the
audit checks that every confirmed (event, service) pair was handled, that
each service's archive holds exactly its poison events and the bad input,
and that no message is left in a main or delay queue.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from amqp_events import PublishError, events_app
from amqp_events.archive import Archive
from amqp_events.local_broker import LocalBroker
from amqp_events.management import ManagementAPI
from amqp_events.worker_process import WorkerProcess, worker_argv
from faults import probes

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
    confirmed: int = 0
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
    broker_restarts: int = 0
    bad_inputs: int = 0
    refused_bad_inputs: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.archive_missing or self.archive_unexpected or self.leftover)

    def table(self) -> str:
        rows = [
            ("events fired (confirmed by the broker)", self.confirmed),
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
            ("bad inputs published", self.bad_inputs),
            ("bad inputs the broker refused at publish time", self.refused_bad_inputs),
            ("duration (s)", round(self.seconds)),
        ]
        return "\n".join(f"| {label} | {value} |" for label, value in rows)


class Chaos(threading.Thread):
    """Every 2-4 s, SIGKILL a random worker's process group and start it again."""

    def __init__(self, workers: list[WorkerProcess], rng: random.Random) -> None:
        super().__init__(daemon=True, name="chaos")
        self.workers, self.rng = workers, rng
        self.kills = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.rng.uniform(2, 4)):
            index = self.rng.randrange(len(self.workers))
            self.workers[index].kill()
            self.workers[index] = restart(self.workers[index])
            self.kills += 1


def restart(worker: WorkerProcess) -> WorkerProcess:
    return WorkerProcess(worker.argv, worker.env, worker.cwd, worker.log_path).start()


def run(events: int, workdir: Path, duration: float, seed: int = 7, deadline: float = 300) -> Report:
    """One full fault-injection run; returns the audit."""
    rng = random.Random(seed)
    report = Report(events)
    started = time.monotonic()
    node = LocalBroker(workdir / "broker", config={"max_message_size": str(probes.MAX_MESSAGE_SIZE)})
    node.start()
    workers: list[WorkerProcess] = []
    try:
        node.management.create_vhost("faults")
        url = node.vhost_url("faults")
        journal = workdir / "journal.jsonl"
        journal.touch()
        for service in SERVICES:
            for pool, concurrency in POOLS:
                argv = worker_argv("faults.service", pool=pool, concurrency=concurrency, name=f"{service}-{pool}")
                env = {"SERVICE": service, "BROKER_URL": url, "JOURNAL": str(journal), "PYTHONPATH": str(ROOT)}
                env["TMPDIR"] = str(workdir)  # what a SIGKILLed worker leaves behind goes with the run
                log = workdir / f"{service}-{pool}.log"
                workers.append(WorkerProcess(argv, {**os.environ, **env}, ROOT, log).start())
        for worker in workers:
            worker.wait_ready(120)
        time.sleep(3)  # RabbitMQ 3.10 can lose a quorum queue declared ~2 s before a crash (RELIABILITY.md)

        chaos = Chaos(workers, rng)
        chaos.start()
        confirmed = fire_under_chaos(url, events, duration, node, report)
        chaos.halt.set()
        chaos.join()
        report.worker_kills = chaos.kills
        for index, worker in enumerate(workers):
            if not worker.is_running():
                workers[index] = restart(worker)
        audit(url, node.management, journal, confirmed, report, deadline)
    finally:
        for worker in workers:
            worker.stop()
        node.stop()
    report.seconds = time.monotonic() - started
    return report


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


def fire_under_chaos(url: str, events: int, duration: float, node: LocalBroker, report: Report) -> dict[int, str]:
    """Fire ``events`` events over ``duration`` seconds; crash the broker at 40%, send bad input at 70%."""
    app = events_app("loadgen", broker_url=url, amqp_events_publish_timeout=3)
    confirmed: dict[int, str] = {}
    interval = duration / events
    start = time.monotonic()
    crash: threading.Thread | None = None
    for seq in range(events):
        time.sleep(max(0.0, start + seq * interval - time.monotonic()))
        if seq == int(events * 0.4):
            crash = crash_broker(node, report, down=6)
        if seq == int(events * 0.7):
            send_probes(url, report)
        while seq not in confirmed:
            try:
                confirmed[seq] = app.fire(KINDS[seq % 3], [], {"seq": seq, "poison": poison_of(seq)})
            except PublishError:
                report.fire_errors += 1  # raised within the publish timeout: fire again
                time.sleep(0.5)
    if crash is not None:
        crash.join()
    app.close()
    report.confirmed = len(confirmed)
    return confirmed


def send_probes(url: str, report: Report) -> None:
    def refused(probe: probes.Probe, exc: Exception) -> None:
        report.refused_bad_inputs += 1

    for probe in probes.PROBES:
        probes.publish(url, probe, refused)
        report.bad_inputs += 1


def audit(
    url: str, management: ManagementAPI, journal: Path, confirmed: dict[int, str], report: Report, deadline: float
) -> None:
    """Wait (bounded) until every event reached its end, then record what is missing or left over."""
    app = events_app("auditor", broker_url=url)
    expected_handled = {(seq, service) for seq in confirmed if not poison_of(seq) for service in SERVICES}
    expected_archive = {f"{service}:{seq}" for seq in confirmed if poison_of(seq) for service in SERVICES} | {
        f"{service}:{probe.name}" for probe in probes.PROBES if probe.reason for service in SERVICES
    }
    report.expected_pairs = len(expected_handled)
    end = time.monotonic() + deadline
    while True:
        runs = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
        handled = Counter((run["seq"], run["service"]) for run in runs if run["outcome"] == "ok")
        archived_keys, reasons = archive_contents(app)
        leftover = leftover_messages(management, "faults")
        settled = expected_handled <= set(handled) and expected_archive <= set(archived_keys) and not leftover
        if settled or time.monotonic() > end:
            break
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
    app.close()


def archive_contents(app: object) -> tuple[Counter[str], Counter[str]]:
    """``service:seq`` (or ``service:probe``) of every archived message, and the count per reason."""
    keys: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for service in SERVICES:
        for entry in Archive(app, service).list():  # type: ignore[arg-type]
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
