"""After the chaos: wait (bounded) until every event reached its end, then count what is missing or left over."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from sqlalchemy import Engine

from amqp_events import events_app
from amqp_events.testing import json_lines
from amqp_events.transport.management import ManagementAPI
from faults import effects, probes
from faults.chaos import StrandedDeadLetters
from faults.plan import SERVICES, poison_of
from faults.report import Report


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
