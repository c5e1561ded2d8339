"""Moving a service from celery-amqp-events 0.1.0 (from PyPI, in a virtualenv of its own) as the upgrading guide
says, on a real broker: nothing lost, and only what the guide says may run twice runs twice."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from docs_pages import code_blocks, page
from helpers import queue_state

from amqp_events.testing import json_lines, wait_for
from amqp_events.testing.workers import WORKER_FLAGS, WorkerProcess
from bench.harness import legacy_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
AMQP_EVENTS = str(Path(sys.executable).parent / "amqp-events")

#: The same service in both versions: its handler writes what it handled, and says which version it is.
ORDERS = """\
import json
import os

from amqp_events.celery import events_app

app = events_app("orders", broker_url=os.environ["BROKER_URL"])


@app.handler("billing.invoice.paid")
def on_invoice_paid(invoice_id, amount):
    if invoice_id == 0 and VERSION == "0.1.0":
        raise RuntimeError("a bug only the new version fixes")
    with open(os.environ["JOURNAL"], "a") as journal:
        journal.write(json.dumps({"version": VERSION, "invoice": invoice_id}) + "\\n")
"""
#: 0.1.0 fires from an app without handlers (it cannot fire from one that has them on Celery 5.6+).
BILLING_0_1_0 = """\
import os
import sys

from amqp_events.celery import events_app

app = events_app("billing", broker_url=os.environ["BROKER_URL"])


@app.event("billing.invoice.paid")
def invoice_paid(invoice_id, amount):
    pass


for invoice in sys.argv[1:]:
    invoice_paid(int(invoice), "1.00")
"""


def service(directory: Path, version: str) -> Path:
    (directory / "orders").mkdir(parents=True)
    (directory / "orders" / "__init__.py").write_text("")
    (directory / "orders" / "celery.py").write_text(f"VERSION = {version!r}\n" + ORDERS)
    return directory


def test_a_service_moves_from_0_1_0_as_the_guide_says(tmp_path, rabbitmq, vhost, broker_url, start_worker, producer):
    guide = " ".join(page("guides/upgrading.md").split())
    old, new = service(tmp_path / "old", "0.1.0"), service(tmp_path / "new", "0.2")
    (old / "billing.py").write_text(BILLING_0_1_0)
    journal = tmp_path / "journal.jsonl"
    env = {**os.environ, "BROKER_URL": broker_url, "JOURNAL": str(journal), "AMQP_EVENTS_MAX_RETRIES": "1"}
    legacy = legacy_python()

    def fire_with_0_1_0(*invoices: int) -> None:
        subprocess.run([legacy, "billing.py", *map(str, invoices)], cwd=old, env=env, check=True, timeout=60)

    def handled(version: str) -> list[int]:
        return sorted(line["invoice"] for line in json_lines(journal) if line["version"] == version)

    def messages(queue: str) -> int:
        return queue_state(producer, queue)[0]

    argv = [legacy, "-m", "celery", "-A", "orders.celery", "worker", *WORKER_FLAGS, "-P", "solo", "--loglevel=INFO"]
    old_worker = WorkerProcess(argv, {**env, "PYTHONPATH": str(old)}, old, tmp_path / "old-worker.log")
    try:
        old_worker.start().wait_ready(60)
        fire_with_0_1_0(0, 1, 2)
        wait_for(lambda: handled("0.1.0") == [1, 2], 30, what="0.1.0 handling")
        wait_for(lambda: messages("orders:archived") == 1, 30, what="0.1.0 archiving invoice 0")

        # 1. The new topology, declared as the guide says: from now on events reach both queues.
        declare = "amqp-events -A orders.celery topology declare"
        assert declare in guide
        new_env = {**env, "PYTHONPATH": str(new)}
        done = subprocess.run(
            [AMQP_EVENTS, *declare.split()[1:]], cwd=new, env=new_env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        fire_with_0_1_0(3)  # between steps 1 and 2: in both queues
        # 2. The old queue unbound from the events exchange (the management HTTP API).
        bindings = f"/api/bindings/{vhost}/e/events/q/{quote('orders.billing.invoice.paid')}"
        [binding] = rabbitmq.management.request("GET", bindings)
        rabbitmq.management.request("DELETE", f"{bindings}/{quote(binding['properties_key'])}")
        fire_with_0_1_0(4)
        producer.fire("billing.invoice.paid", [5, "1.00"])  # the new version's producer
        # 3. The new workers.
        start_worker("orders.celery", cwd=new, env=new_env)
        # 4. The old workers stop once their queues are empty.
        wait_for(
            lambda: messages("orders.billing.invoice.paid") == messages("orders:retry") == 0,
            30,
            what="0.1.0's queues drained",
        )
        assert old_worker.stop() == 0
    finally:
        old_worker.stop()

    # 5. What 0.1.0 archived, moved back with the guide's script.
    (tmp_path / "move_archived.py").write_text(code_blocks()["move_archived.py"])
    moved = subprocess.run(
        [sys.executable, "move_archived.py", broker_url, "orders"], cwd=tmp_path, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    assert "moved 1 archived event(s) of orders" in moved.stdout
    wait_for(lambda: handled("0.2") == [0, 3, 4, 5], 30, what="the new version handling")
    assert handled("0.1.0") == [1, 2, 3]  # 3 was fired between steps 1 and 2: both ran it, as the guide says
    assert messages("orders:archived") == 0 and messages("orders.archive") == 0


def quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")
