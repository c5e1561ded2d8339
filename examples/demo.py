"""The celery-amqp-events demo.

Starts a private, throwaway RabbitMQ node, runs three services as real Celery
workers (``orders``, ``shipping``, ``notifications``), fires a stream of
``billing.invoice.paid`` events from ``billing`` and shows who handled what:
retries of a flaky handler, a delay waited out on the broker, and a message
that can never succeed landing in the archive. Everything it started is
stopped at the end, also on Ctrl-C; with ``--keep`` the broker is left
running, to inspect and replay the archive with ``amqp-events``.

Run it with ``bash scripts/demo`` (or ``python examples/demo.py --events 200``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from amqp_events.archive import Archive  # noqa: E402
from amqp_events.local import registry  # noqa: E402
from amqp_events.local.broker import LocalBroker  # noqa: E402
from amqp_events.testing import json_lines  # noqa: E402
from amqp_events.testing.workers import WorkerProcess, worker_argv  # noqa: E402

SERVICES: dict[str, tuple[str | None, int]] = {  # service -> (pool, concurrency); None: no -P, as users type it
    "orders": (None, 2),
    "shipping": ("solo", 1),
    "notifications": ("solo", 1),
}
#: The command line installed beside this Python (the project's .venv/bin/amqp-events).
AMQP_EVENTS = Path(sys.executable).parent / "amqp-events"
CUSTOMERS = ["ada", "grace", "linus", "ada", "grace", "linus", "ada", "grace", "linus", "nobody"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=60, help="how many invoices to pay (default 60)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for the handlers")
    parser.add_argument(
        "--keep", action="store_true", help="leave the broker running at the end, to look at it with amqp-events"
    )
    options = parser.parse_args()
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)  # a SIGTERM cleans up as Ctrl-C does

    workdir = Path(tempfile.mkdtemp(prefix="amqp-events-demo-"))
    node = LocalBroker(workdir / "broker")
    workers: list[WorkerProcess] = []
    started = time.monotonic()
    try:
        say(f"starting a private RabbitMQ node (its own ports and data, under {workdir})...")
        node.start()
        say(f"broker ready at {node.url} (management UI {node.management_url}, guest/guest)")
        journal = workdir / "journal.jsonl"
        journal.touch()
        env = {**os.environ, "BROKER_URL": node.url, "DEMO_JOURNAL": str(journal), "PYTHONPATH": str(HERE)}
        for service, (pool, concurrency) in SERVICES.items():
            argv = worker_argv(service, pool=pool, concurrency=concurrency, name=service)
            workers.append(WorkerProcess(argv, env, HERE, workdir / f"{service}.log").start())
        for worker in workers:
            worker.wait_ready(60)
        say("workers ready: " + ", ".join(f"{s} ({p or 'the default pool'}, {c})" for s, (p, c) in SERVICES.items()))

        os.environ["BROKER_URL"] = node.url
        import billing

        try:
            billing.invoice_paid(0, "-5.00", "ada")
        except ValueError as exc:
            say(f"validation runs before publishing: {exc} (nothing was published)")
        fire(billing, options.events)
        outcome = wait_for_handlers(journal, options.events, options.timeout)
        summarize(outcome, billing.app.archive("shipping"), time.monotonic() - started, node, options.keep)
        billing.app.close()
        return 0
    except KeyboardInterrupt:
        say("\ninterrupted: stopping everything the demo started")
        options.keep = False
        return 130
    finally:
        for worker in workers:
            worker.stop()
        if options.keep and node.state is not None:
            registry.remember(node.state.amqp_port, node.directory)  # `amqp-events broker status` finds it
            say(f"stopped the workers; the broker keeps running. Stop it (and remove {workdir}) with:")
            say(f"  {AMQP_EVENTS} broker stop --dir {node.directory} && rm -r {workdir}")
        else:
            node.stop()
            shutil.rmtree(workdir, ignore_errors=True)
            say(f"stopped the workers and the broker; removed {workdir}")


INTERRUPTED = threading.Event()


def interrupt(*_: object) -> None:
    INTERRUPTED.set()
    raise KeyboardInterrupt


def stop_if_interrupted() -> None:
    """Raise KeyboardInterrupt again if one came: Python ignores it when a finaliser was running."""
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt


def fire(billing, count: int) -> None:
    for number in range(1, count + 1):
        stop_if_interrupted()
        customer = CUSTOMERS[number % len(CUSTOMERS)]
        billing.invoice_paid(number, f"{10 + number}.00", customer)
        progress(f"fired {number}/{count} billing.invoice.paid (each confirmed by the broker)")
    progress_done()


def wait_for_handlers(journal: Path, count: int, timeout: float) -> list[dict]:
    """Until every service reached a final outcome for every invoice (or the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        stop_if_interrupted()
        lines = json_lines(journal)
        final = {(line["service"], line["invoice"]) for line in lines if line["outcome"] in ("handled", "archived")}
        done = Counter(service for service, _ in final)
        latest = {(line["service"], line["invoice"]): line["outcome"] for line in lines}  # the journal is in order
        retries = sum(1 for outcome in latest.values() if outcome in ("failed", "postponed"))
        progress(
            " | ".join(f"{service} {done[service]}/{count}" for service in SERVICES)
            + f" | retries waiting on the broker: {retries}"
        )
        if len(final) == count * len(SERVICES) or time.monotonic() > deadline:
            progress_done()
            return lines
        time.sleep(0.2)


def summarize(lines: list[dict], archive: Archive, seconds: float, node: LocalBroker, keep: bool) -> None:
    say("\nwho handled what")
    say(f"  {'service':<15}{'handled':>8}{'retried runs':>14}{'archived':>10}  longest wait on the broker")
    for service in SERVICES:
        mine = [line for line in lines if line["service"] == service]
        counts = Counter(line["outcome"] for line in mine)
        attempts = max((line["attempt"] for line in mine), default=1)
        say(
            f"  {service:<15}{counts['handled']:>8}{counts['failed'] + counts['postponed']:>14}"
            f"{counts['archived']:>10}  up to attempt {attempts}"
        )
    say("\nshipping's archive:")
    for entry in archive.list():
        say(f"  {entry.id}  {entry.event}  reason={entry.reason}  {entry.exception_message}")
    if keep:
        say("inspect and replay it while the broker runs:")
        for command in ("list", "show ID", "replay"):
            say(f"  BROKER_URL={node.url} PYTHONPATH={HERE} {AMQP_EVENTS} -A shipping archive {command}")
    else:
        say("(run the demo with --keep to inspect and replay it with `amqp-events -A shipping archive list|replay`)")
    say(f"\ndone in {seconds:.1f}s")


def say(text: str) -> None:
    print(text, flush=True)


def progress(text: str, shown: list[str] = []) -> None:  # noqa: B006  # the last line shown, kept across calls
    """One line rewritten in place on a terminal; a plain line for each change when the output is a file or a pipe."""
    if sys.stdout.isatty():
        print("\r" + text.ljust(100), end="", flush=True)
    elif shown != [text]:
        shown[:] = [text]
        print(text, flush=True)


def progress_done() -> None:
    if sys.stdout.isatty():
        print()


if __name__ == "__main__":
    sys.exit(main())
