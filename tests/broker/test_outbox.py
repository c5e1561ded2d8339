"""The transactional outbox: real broker, real PostgreSQL and SQLite, real workers and relays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import TESTS, assert_broker_waited, scrape, value
from outbox_helpers import AMQP_EVENTS, drain_ids, invoices, metadata, relay_process, relaying
from sqlalchemy import create_engine, func, insert, select
from sqlalchemy.orm import Session

from amqp_events import events_app
from amqp_events.local.broker import LocalBroker
from amqp_events.local.processes import free_port
from amqp_events.testing import wait_for


@pytest.fixture
def outbox(producer, database):
    """The outbox of this test's database, created, with the business table beside it."""
    store = producer.outbox_store(database)
    store.create()
    metadata.create_all(store.engine)
    yield store
    store.engine.dispose()


def pending(store) -> int:
    return store.stats().pending


def test_an_event_leaves_if_and_only_if_the_transaction_commits(outbox, worker, producer, records):
    worker("orders")
    engine = outbox.engine
    with pytest.raises(RuntimeError, match="payment declined"), Session(engine) as session, session.begin():
        session.execute(insert(invoices).values(id=1, amount="1.00"))
        with producer.outbox(session):
            rolled_back = producer.fire("test.ping", ["rolled back"], {})
        raise RuntimeError("payment declined")
    with Session(engine) as session, session.begin():
        session.execute(insert(invoices).values(id=2, amount="2.00"))
        with producer.outbox(session):
            committed = producer.fire("test.ping", ["committed"], {}, key="invoice-2")
    assert pending(outbox) == 1  # nothing is published before a relay runs
    with relaying(producer, outbox):
        [record] = records.wait(1)
        records.barrier(producer, ("orders",))
    assert record["id"] == committed and records.all(id=rolled_back) == [] and len(records.all()) == 1
    assert record["key"] == "invoice-2"  # the relay publishes the row's headers as written
    assert pending(outbox) == 0
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(invoices)).scalar_one() == 1


def test_a_batch_in_the_outbox_writes_its_rows_together_in_the_transaction(outbox, worker, producer, records):
    worker("orders")

    @producer.event("test.ping")
    def ping(tag: str, how: dict | None = None) -> None:
        if not tag:
            raise ValueError("tag required")

    with Session(outbox.engine) as session, session.begin():
        with producer.outbox(session), producer.batch() as batch:
            ids = [ping(f"b{n}") for n in range(50)]
            with pytest.raises(ValueError):
                ping("")  # validation runs at each call, as when publishing
            assert pending(outbox) == 0  # written when the batch ends
        assert batch.ids == ids
    assert pending(outbox) == 50
    with relaying(producer, outbox):
        seen = records.wait(50)
    assert [record["id"] for record in sorted(seen, key=lambda record: record["time"])] == ids  # in order


def test_core_connections_and_delayed_events(outbox, worker, producer, records):
    worker("orders")
    fired = time.time()
    with outbox.engine.begin() as connection, producer.outbox(connection):
        later = producer.fire("test.ping", ["later"], {}, countdown=3)
        now = producer.fire("test.ping", ["now"], {})
    with relaying(producer, outbox):
        first, second = records.wait(2, timeout=30)
    assert (first["id"], second["id"]) == (now, later)
    assert_broker_waited(second["time"] - fired, 3)  # the delay counts from the fire, and never less


@pytest.mark.parametrize("engine_kind", ["sqlite", "postgresql"])
def test_the_in_process_relay_publishes_right_after_the_commit(
    engine_kind, request, tmp_path, broker_url, worker, records
):
    worker("orders")
    url = (
        f"sqlite:///{tmp_path / 'shop.sqlite3'}" if engine_kind == "sqlite" else request.getfixturevalue("postgres_url")
    )
    app = events_app("shop", broker_url=broker_url, amqp_events_outbox_relay=True)
    engine = create_engine(url)
    app.outbox_store(engine=engine).create()
    try:
        with Session(engine) as session, session.begin(), app.outbox(session):
            event_id = app.fire("test.ping", ["in process"], {})
        [record] = records.wait(1, timeout=20)
        assert record["id"] == event_id and record["fired_by"] is None  # the tests' shared user verifies nobody
    finally:
        app.close()
        engine.dispose()


def test_committed_events_of_a_killed_process_are_delivered_once_a_relay_runs(
    outbox, database, broker_url, worker, records
):
    worker("orders")
    writer = subprocess.run(
        [sys.executable, str(TESTS / "services" / "outbox_writer.py"), database, "5"],
        env={**os.environ, "PYTHONPATH": str(TESTS)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert writer.returncode == -signal.SIGKILL, writer.stderr  # killed right after its commit
    ids = writer.stdout.split()
    assert len(ids) == 5 and pending(outbox) == 5
    with relaying(events_app("relay", broker_url=broker_url), outbox) as relay:
        seen = records.wait(5)
    assert sorted(record["id"] for record in seen) == sorted(ids) and relay.published == 5


def test_requests_keep_succeeding_while_the_broker_is_down_and_the_backlog_drains(
    postgres_url, rabbitmq, producer, worker, records
):
    if rabbitmq.node is None:
        pytest.skip("needs the harness's own node (not $AMQP_URL) to stop it")
    worker("orders").stop()
    worker("shipping").stop()  # both subscribe to test.ping; their queues exist
    store = producer.outbox_store(postgres_url)
    store.create()
    metadata.create_all(store.engine)
    with relaying(producer, store):
        rabbitmq.node.stop()
        try:
            down = time.monotonic()
            for n in range(1000):  # a request: a business write and an event, one transaction
                with Session(store.engine) as session, session.begin():
                    session.execute(insert(invoices).values(id=n, amount="1.00"))
                    with producer.outbox(session):
                        producer.fire("test.ping", [f"r{n}"], {})
            assert pending(store) == 1000
            time.sleep(max(0.0, 30 - (time.monotonic() - down)))  # down for 30 s in all
        finally:
            rabbitmq.node.start()
        worker("orders")
        worker("shipping")
        for service in ("orders", "shipping"):
            assert len({record["tag"] for record in records.wait(1000, timeout=120, service=service)}) == 1000
    assert pending(store) == 0


@pytest.mark.parametrize("relays", [2, 4])
def test_several_relays_on_one_postgresql_outbox_do_not_double_publish(
    relays, postgres_url, producer, service_app, broker_url, tmp_path
):
    service_app("orders").declare_topology()
    store = producer.outbox_store(postgres_url)
    store.create()
    events = 20_000
    with store.engine.begin() as connection, producer.outbox(connection), producer.batch():
        for n in range(events):
            producer.fire("test.ping", [f"m{n}"], {})
    processes = [relay_process(postgres_url, broker_url, tmp_path / f"relay{n}.log") for n in range(relays)]
    try:
        wait_for(lambda: pending(store) == 0, 180, interval=0.5, what="every row published")
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        codes = [process.wait(30) for process in processes]
    assert codes == [0] * relays  # a clean stop on SIGTERM
    seen = drain_ids(broker_url, "orders:test.ping")
    duplicates = sum(seen.values()) - len(seen)
    print(f"\n{relays} relays, {events} events: {len(seen)} delivered, {duplicates} duplicate(s)")
    assert len(seen) == events and duplicates == 0


def test_rows_of_a_relay_killed_mid_batch_are_published_after_its_lease(
    postgres_url, producer, service_app, broker_url, tmp_path
):
    service_app("orders").declare_topology()
    store = producer.outbox_store(postgres_url)
    store.create()
    events, batch = 5000, 500
    with store.engine.begin() as connection, producer.outbox(connection), producer.batch():
        for n in range(events):
            producer.fire("test.ping", [f"m{n}"], {})
    options = ("--batch", str(batch), "--lease", "3")
    first = relay_process(postgres_url, broker_url, tmp_path / "first.log", *options)
    wait_for(lambda: pending(store) < events - batch, 60, interval=0.01, what="the first relay under way")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    left = pending(store)
    second = relay_process(postgres_url, broker_url, tmp_path / "second.log", *options)
    try:
        wait_for(lambda: pending(store) == 0, 120, interval=0.5, what="every row published by the second relay")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    seen = drain_ids(broker_url, "orders:test.ping")
    duplicates = sum(seen.values()) - len(seen)
    print(f"\nkilled with {left} rows left: {len(seen)} delivered, {duplicates} duplicate(s)")
    assert len(seen) == events  # none lost
    assert duplicates <= batch  # only rows of the batch in flight when it died


def test_a_second_relay_on_a_sqlite_outbox_is_refused(tmp_path, producer, broker_url):
    database = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    producer.outbox_store(database).create()
    first = relay_process(database, broker_url, tmp_path / "first.log")
    try:
        wait_for(lambda: "started on" in (tmp_path / "first.log").read_text(), 30, what="the first relay")
        second = relay_process(database, broker_url, tmp_path / "second.log")
        assert second.wait(30) == 1
        said = (tmp_path / "second.log").read_text()
        assert "already relays the SQLite outbox" in said and f"pid {first.pid}" in said
        assert len(said.strip().splitlines()) == 1 and first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(30)


@pytest.fixture
def small_node(tmp_path):
    """A node of its own that refuses messages over 1 MiB."""
    node = LocalBroker(tmp_path / "small", config={"max_message_size": str(1024 * 1024)})
    node.start()
    yield node
    node.stop()


def test_rows_that_can_never_be_published_are_set_aside_and_the_relay_goes_on(
    small_node, tmp_path, worker, records, cli
):
    app = events_app("shop", broker_url=small_node.url)
    database = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    store = app.outbox_store(database)
    store.create()
    with store.engine.begin() as connection, app.outbox(connection):
        app.fire("test.ping", ["x" * (2 * 1024 * 1024)], {})  # larger than the broker takes
        app.fire("test.ping", ["fine"], {})
    with store.engine.begin() as connection:  # a row written by hand, unreadable
        connection.execute(
            insert(store.tables.rows).values(
                event_id="bad-row", event="test.ping", service="shop", exchange="events", routing_key="test.ping",
                headers="{not json", body="[]", created_at=time.time(),
            )
        )  # fmt: skip
    with relaying(app, store):
        wait_for(lambda: store.stats().dead == 2 and store.stats().pending == 0, 60, what="two rows set aside")
    dead = {row.event_id: row.last_error for row in store.rows(dead=True)}
    assert "bad-row" in dead and "cannot be read back" in dead["bad-row"]
    [too_large] = [error for event_id, error in dead.items() if event_id != "bad-row"]
    assert "PRECONDITION_FAILED" in too_large and "max size" in too_large
    app.close()


def test_operators_list_retry_and_purge_dead_rows(outbox, database, producer, worker, records, cli_process):
    worker("orders")
    with outbox.engine.begin() as connection:
        for event_id in ("dead-1", "dead-2"):
            connection.execute(
                insert(outbox.tables.rows).values(
                    event_id=event_id, event="test.ping", service="tests", exchange="events", routing_key="test.ping",
                    headers="{not json", body="[]", created_at=time.time(), dead_at=time.time(), attempts=10,
                    last_error="cannot be read back",
                )
            )  # fmt: skip
    listed = cli_process("outbox", "list", "--db", database)
    assert listed.exit_code == 0 and "dead-1" in listed.output and "2 row(s)" in listed.output
    status = cli_process("outbox", "status", "--db", database)
    assert "pending: 0" in status.output and "dead:    2" in status.output
    [one, two] = [row.id for row in outbox.rows(dead=True)]
    assert f"purged row {one}" in cli_process("outbox", "purge", "--db", database, "--id", str(one), "--yes").output
    retried = cli_process("outbox", "retry", "--db", database, "--all", "--yes")
    assert f"retrying row {two}" in retried.output and outbox.stats().pending == 1


def test_django_atomic_blocks_write_the_outbox_through_djangos_connection(
    postgres_url, broker_url, producer, worker, records
):
    worker("orders")
    shop = subprocess.run(
        [sys.executable, str(TESTS / "services" / "django_shop.py"), postgres_url.replace("+psycopg", "")],
        env={**os.environ, "BROKER_URL": broker_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shop.returncode == 0, shop.stderr
    rolled_back, committed = shop.stdout.split()
    store = producer.outbox_store(postgres_url)  # the table Django's migration made
    assert [row.event_id for row in store.rows(dead=False)] == [committed]
    with relaying(producer, store):
        [record] = records.wait(1)
        records.barrier(producer, ("orders",))
    assert record["id"] == committed and records.all(id=rolled_back) == []


def test_a_relay_serves_its_metrics(postgres_url, producer, service_app, broker_url, tmp_path):
    service_app("orders").declare_topology()
    store = producer.outbox_store(postgres_url)
    store.create()
    with store.engine.begin() as connection, producer.outbox(connection), producer.batch():
        for n in range(20):
            producer.fire("test.ping", [f"m{n}"], {})
    port = free_port()
    relay = relay_process(postgres_url, broker_url, tmp_path / "relay.log", "--metrics-port", str(port))
    try:
        wait_for(lambda: pending(store) == 0, 60, what="every row published")

        def drained() -> dict[str, float]:
            metrics = scrape(port)
            return metrics if value(metrics, "amqp_events_outbox_pending", table="amqp_events_outbox") == 0 else {}

        metrics = wait_for(drained, 20, what="the pending gauge back to 0")  # refreshed every 5 s
        assert value(metrics, "amqp_events_outbox_published_total", service="tests") == 20
        assert value(metrics, "amqp_events_outbox_oldest_pending_age_seconds") == 0
        assert value(metrics, "amqp_events_outbox_dead") == 0
        status = json.loads(subprocess.run(
            [AMQP_EVENTS, "-A", "services.orders", "outbox", "status", "--db", postgres_url, "--json"],
            cwd=TESTS, env={**os.environ, "BROKER_URL": broker_url}, capture_output=True, text=True, timeout=60,
        ).stdout)  # fmt: skip
        assert status["pending"] == 0 and [alive["relay"].split(":")[1] for alive in status["relays"]] == [
            str(relay.pid)
        ]
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.wait(30)
