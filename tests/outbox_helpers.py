"""What the outbox tests share: a business table, a relay in a thread, relays as processes, a queue drained."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kombu import Connection, Queue
from sqlalchemy import Column, Integer, MetaData, String, Table

from amqp_events import EventsApp
from amqp_events.local.processes import start_session
from amqp_events.outbox.relay import Relay
from amqp_events.outbox.store import OutboxStore

TESTS = Path(__file__).parent
AMQP_EVENTS = str(Path(sys.executable).parent / "amqp-events")

metadata = MetaData()
invoices = Table("invoices", metadata, Column("id", Integer, primary_key=True), Column("amount", String(20)))


@contextmanager
def relaying(app: EventsApp, store: OutboxStore, **options: float) -> Iterator[Relay]:
    """A relay running in a thread of the test for the block; it must stop cleanly at the end."""
    relay = Relay(app.context, store, poll_interval=options.pop("poll_interval", 0.2), **options)  # type: ignore[arg-type]
    thread = threading.Thread(target=relay.run, daemon=True, name="test-relay")
    thread.start()
    try:
        yield relay
    finally:
        relay.stop()
        thread.join(30)
        assert not thread.is_alive(), "the relay did not stop"


def relay_process(database: str, broker_url: str, log: Path, *options: str) -> subprocess.Popen[bytes]:
    """``amqp-events -A services.orders outbox relay --db DATABASE`` as a process of its own."""
    with log.open("ab") as out:
        return start_session(
            [AMQP_EVENTS, "-A", "services.orders", "outbox", "relay", "--db", database, *options],
            cwd=TESTS,
            env={**os.environ, "BROKER_URL": broker_url, "PYTHONPATH": str(TESTS)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def drain_ids(broker_url: str, queue: str) -> Counter[str]:
    """Take every message out of ``queue``: how many times each event id was in it."""
    seen: Counter[str] = Counter()

    def on_message(body: object, message: object) -> None:
        seen[message.headers["id"]] += 1  # type: ignore[attr-defined]

    with Connection(broker_url) as connection:
        consumer = connection.Consumer(Queue(queue, no_declare=True), callbacks=[on_message], no_ack=True)
        consumer.qos(prefetch_count=1000)
        with consumer:
            while True:
                try:
                    connection.drain_events(timeout=2)
                except TimeoutError:
                    return seen
