"""Getting started as a new user follows it: its files and exactly its commands, on one machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from docs_pages import code_blocks, page
from kombu import Connection

from amqp_events.core.policy import RetryPolicy
from amqp_events.settings import Settings
from amqp_events.testing import wait_for

AMQP_EVENTS = str(Path(sys.executable).parent / "amqp-events")


def write_quick_start(directory: Path, broker_url: str, failing: bool = False) -> dict[str, str]:
    """The Quick start's files in ``directory`` (``failing``: its orders handler raises); their environment."""
    for name in ("orders/celery.py", "orders/handlers.py", "shipping/celery.py", "fire.py"):
        body = code_blocks()[name].replace("amqp://guest:guest@localhost:5672/", broker_url)
        if failing and name == "orders/handlers.py":
            body = body.replace(
                'print(f"invoice {invoice_id} paid: {amount}")', 'raise ConnectionError("provider down")'
            )
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        (path.parent / "__init__.py").touch()
    return {"PYTHONPATH": str(directory)}


#: The processes of a worker started as written: Celery's default concurrency, the number of CPUs, each consuming.
PROCESSES = os.cpu_count() or 1


def as_written(start_worker, service: str, directory: Path, env: dict[str, str]):  # type: ignore[no-untyped-def]
    """``celery -A <service>.celery worker`` exactly as the Quick start gives it (no -n, no -P, no --loglevel)."""
    command = f"celery -A {service}.celery worker --without-mingle --without-heartbeat --without-gossip"
    assert command in page("getting-started.md")
    return start_worker(f"{service}.celery", as_written=True, ready=False, cwd=directory, env=env)


def consumers(broker_url: str, queue: str) -> int:
    with Connection(broker_url) as connection:
        return int(connection.default_channel.queue_declare(queue, passive=True).consumer_count)


def wait_consumers(broker_url: str, wanted: dict[str, int]) -> None:
    """Until each queue exists and has its consumers (passive declares: exact, unlike the management API)."""

    def ready() -> bool:
        try:
            return all(consumers(broker_url, queue) == count for queue, count in wanted.items())
        except Exception:  # not declared yet
            return False

    wait_for(ready, 60, interval=0.3, what=f"consumers {wanted}")


def test_two_services_and_a_second_worker_of_one_start_side_by_side_as_written(tmp_path, start_worker, broker_url):
    env = write_quick_start(tmp_path, broker_url)
    orders = [as_written(start_worker, "orders", tmp_path, env) for _ in range(2)]
    shipping = as_written(start_worker, "shipping", tmp_path, env)
    wait_consumers(
        broker_url, {"orders:billing.invoice.paid": 2 * PROCESSES, "shipping:billing.invoice.paid": PROCESSES}
    )
    names = {re.search(r"(\S+@\S+) v\d", worker.log()).group(1) for worker in (*orders, shipping)}  # banners
    assert len(names) == 3 and all(name.split("@")[0].rsplit("-", 1)[0] in ("orders", "shipping") for name in names)

    fired = subprocess.run(
        [sys.executable, "fire.py"], cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )
    assert fired.returncode == 0, fired.stderr
    event_id = re.fullmatch(r"fired billing.invoice.paid ([0-9a-f-]{36})\n", fired.stdout).group(1)
    wait_for(lambda: "courier booked for invoice 42" in shipping.log(), 30, what="shipping's handler")
    wait_for(lambda: sum("invoice 42 paid: 10.00" in w.log() for w in orders) == 1, 30, what="one orders worker")
    assert event_id

    # Remote control reaches the workers of the service it names, and only them.
    def breakers(action: str) -> subprocess.CompletedProcess[str]:
        argv = [AMQP_EVENTS, "-A", "orders.celery", "breakers", action, "on_invoice_paid"]
        return subprocess.run(argv, cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)

    pause = breakers("open")
    assert pause.returncode == 0, pause.stdout + pause.stderr
    assert pause.stdout.count(": open orders.handlers.on_invoice_paid") == 2 and "open: 2 worker(s)" in pause.stdout
    assert "shipping" not in pause.stdout
    wait_for(lambda: consumers(broker_url, "orders:billing.invoice.paid") == 0, 30, what="orders paused")
    assert consumers(broker_url, "shipping:billing.invoice.paid") == PROCESSES
    resume = breakers("close")
    assert resume.returncode == 0 and "close: 2 worker(s)" in resume.stdout, resume.stdout + resume.stderr
    resumed = 2 * PROCESSES
    wait_for(lambda: consumers(broker_url, "orders:billing.invoice.paid") == resumed, 30, what="orders resumed")


def test_retries_show_at_the_default_log_level_and_fewer_of_them_archive_sooner(tmp_path, start_worker, broker_url):
    # What the Quick start says of retries: 17 minutes with the defaults, ...
    policy = RetryPolicy.from_settings(Settings())
    waits = [policy.backoff(retries) for retries in range(policy.max_retries)]
    assert (waits[0], waits[-1], sum(waits)) == (1, 512, 1023)
    assert "about 17 minutes (1 + 2 + ... + 512 s)" in " ".join(page("getting-started.md").split())
    # ... and about 3 s with the command it gives for development.
    command = "AMQP_EVENTS_MAX_RETRIES=2 celery -A orders.celery worker --without-mingle --without-heartbeat"
    assert command in page("getting-started.md")
    env = write_quick_start(tmp_path, broker_url, failing=True)
    worker = as_written(start_worker, "orders", tmp_path, {**env, "AMQP_EVENTS_MAX_RETRIES": "2"})
    wait_consumers(broker_url, {"orders:billing.invoice.paid": PROCESSES})
    started = time.monotonic()
    subprocess.run([sys.executable, "fire.py"], cwd=tmp_path, env={**os.environ, **env}, check=True, timeout=60)
    archived = wait_for(lambda: "archived event=billing.invoice.paid" in worker.log(), 30, what="the archive")
    assert archived and 3 <= time.monotonic() - started < 30
    log = worker.log()
    assert "WARNING/" in log.split("retrying event=billing.invoice.paid")[0].splitlines()[-1]  # a warning
    assert log.count("retrying event=billing.invoice.paid") == 2 and "reason=max_retries" in log


def test_the_cli_validates_an_event_the_app_declares_before_firing_it(tmp_path, start_worker, broker_url):
    env = {**os.environ, **write_quick_start(tmp_path, broker_url)}
    worker = start_worker("orders.celery", cwd=tmp_path, env=env)

    def fire(*options: str) -> subprocess.CompletedProcess[str]:
        command = [AMQP_EVENTS, "-A", "orders.celery", "fire", "billing.invoice.paid", *options]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)

    refused = fire("--json", '[8, ""]')
    assert refused.returncode == 1 and "amount required" in refused.stderr, refused.stdout + refused.stderr
    assert fire("--json", '[9, "1.00"]').returncode == 0
    wait_for(lambda: "invoice 9 paid: 1.00" in worker.log(), 30, what="the valid event handled")
    assert "invoice 8" not in worker.log()  # the refused one was never fired
    unchecked = fire("--json", '[10, ""]', "--no-validate")
    assert unchecked.returncode == 0, unchecked.stderr
    wait_for(lambda: "invoice 10 paid: " in worker.log(), 30, what="the unvalidated event handled")
    # `amount: str` takes the text as typed (as JSON, 10.00 would be the float 10.0, refused as not a str)
    typed = fire("--arg", "invoice_id=11", "--arg", "amount=10.00")
    assert typed.returncode == 0, typed.stderr
    wait_for(lambda: "invoice 11 paid: 10.00" in worker.log(), 30, what="the amount as typed")
    wrong = fire("--arg", "invoice_id=abc", "--arg", "amount=1")
    assert wrong.returncode == 1 and "invoice_id='abc' is not an int" in wrong.stderr, wrong.stderr
