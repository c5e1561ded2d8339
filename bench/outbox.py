"""Benchmarks of the outbox and the inbox, on a private PostgreSQL cluster (and SQLite, Redis), side by side.

* commit + fire through the outbox, one event per transaction (a minimal one and a typical one), against the
  same transaction without an event, and against committing then firing directly;
* the relay draining a backlog of pending rows, against ``app.batch()`` firing the same events directly;
* commit-to-publish latency at idle: the in-process relay (SQLite, woken after the commit) and a relay on
  PostgreSQL woken by ``NOTIFY``;
* a handler inserting a row, prefork -c 2, through the inbox or with a Redis dedup store, against the same
  handler without either.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kombu import Connection, Queue
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, create_engine, insert, select, update

from amqp_events.inbox.sql import InboxTable
from amqp_events.local.postgres import LocalPostgres
from amqp_events.outbox.relay import Relay
from amqp_events.topology import service_topology
from amqp_events.transport.declare import declare_topology
from bench.harness import Bench, Run, median, percentile, throughput
from bench.scenarios import Result, Size, ours_app

metadata = MetaData()
invoices = Table("invoices", metadata, Column("id", Integer, primary_key=True), Column("amount", String(20)))
customers = Table("customers", metadata, Column("id", Integer, primary_key=True), Column("balance", Integer))


def postgres_database(postgres: LocalPostgres, name: str) -> Engine:
    engine = create_engine(postgres.create_database(name))
    metadata.create_all(engine)
    return engine


def commit_and_fire(bench: Bench, postgres: LocalPostgres, size: Size, shape: str) -> Result:
    """Transactions per second: a business transaction alone, with an event in the outbox, and then firing directly.

    ``shape``: ``minimal`` (one INSERT: BEGIN, INSERT, COMMIT) or ``typical`` (a request that reads a
    customer row for update, inserts an invoice and updates the customer: five round trips in all).
    """
    with bench.run(f"outbox-commit-{shape}") as run:
        app = ours_app(run)
        app.declare_topology()
        engine = postgres_database(postgres, f"commit_and_fire_{shape}")
        app.outbox_store(engine=engine).create()
        with engine.begin() as connection:
            connection.execute(insert(customers), [{"id": n, "balance": 0} for n in range(100)])
        next_id = iter(range(10**9))

        def request(how: str) -> None:
            invoice = next(next_id)
            with engine.begin() as connection:
                if shape == "typical":
                    customer = invoice % 100
                    connection.execute(select(customers.c.balance).where(customers.c.id == customer).with_for_update())
                connection.execute(insert(invoices).values(id=invoice, amount="10.00"))
                if shape == "typical":
                    connection.execute(
                        update(customers).where(customers.c.id == customer).values(balance=customers.c.balance + 10)
                    )
                if how == "outbox":
                    with app.outbox(connection):
                        app.fire("bench.noop", [invoice], {})
            if how == "direct":
                app.fire("bench.noop", [invoice], {})

        rates: dict[str, list[float]] = {"alone": [], "outbox": [], "direct": []}
        for how in rates:
            request(how)  # warm up
        for _ in range(size.fire_rounds):  # alternate, so that noise hits every variant alike
            for how, values in rates.items():
                started = time.perf_counter()
                for _ in range(size.fire_per_round):
                    request(how)
                values.append(size.fire_per_round / (time.perf_counter() - started))
        app.close()
        engine.dispose()
    alone, outbox, direct = (median(values) for values in rates.values())
    ratio = outbox / alone
    what = "one INSERT" if shape == "minimal" else "SELECT ... FOR UPDATE, INSERT, UPDATE"
    return Result(
        f"commit + fire through the outbox, one event per transaction of {what} (PostgreSQL)",
        f"{outbox:,.0f} transactions/s",
        f"the same transaction without an event: {alone:,.0f}/s; commit, then fire directly: {direct:,.0f}/s "
        f"({outbox / direct:.2f}x)",
        ratio,
        ">= 0.8x the transaction alone",
        ratio >= 0.8,
        {"outbox": outbox, "transaction alone": alone, "fire directly": direct},
    )


def relay_throughput(bench: Bench, postgres: LocalPostgres, size: Size) -> Result:
    """A relay draining ``size.batch`` pending rows, against app.batch() firing as many events directly."""
    relayed, batched = [], []
    for repeat in range(size.repeats):
        with bench.run("outbox-relay") as run:
            app = ours_app(run)
            app.declare_topology()
            engine = postgres_database(postgres, f"relay_{repeat}")
            store = app.outbox_store(engine=engine)
            store.create()
            with engine.begin() as connection, app.outbox(connection), app.batch():
                for n in range(size.batch):
                    app.fire("bench.noop", [n], {})
            relay = Relay(app.context, store)
            started = time.perf_counter()
            while relay.run_once():
                pass
            relayed.append(size.batch / (time.perf_counter() - started))
            assert store.stats().pending == 0 and run.queue_depth("bench:bench.noop") == size.batch
            started = time.perf_counter()
            with app.batch():
                for n in range(size.batch):
                    app.fire("bench.noop", [n], {})
            batched.append(size.batch / (time.perf_counter() - started))
            relay.stop()
            app.close()
            engine.dispose()
    ratio = median(relayed) / median(batched)
    return Result(
        f"relay publishing {size.batch:,} pending rows (PostgreSQL)",
        f"{median(relayed):,.0f} events/s",
        f"app.batch() firing directly: {median(batched):,.0f} events/s",
        ratio,
        ">= 0.5x app.batch()",
        ratio >= 0.5,
        {"relay": median(relayed), "app.batch()": median(batched)},
    )


def commit_to_publish_latency(bench: Bench, postgres: LocalPostgres, size: Size, workdir: Path) -> Result:
    """Milliseconds from a commit to the event reaching a consumer, one event at a time at idle."""
    latencies = {}
    with bench.run("outbox-latency") as run:
        sqlite = create_engine(f"sqlite:///{workdir / 'latency.sqlite3'}")
        metadata.create_all(sqlite)
        latencies["in-process relay, SQLite"] = _latencies(run, sqlite, size, in_process=True)
        latencies["relay woken by NOTIFY, PostgreSQL"] = _latencies(
            run, postgres_database(postgres, "latency"), size, in_process=False
        )
    p50 = {name: percentile(values, 0.5) * 1000 for name, values in latencies.items()}
    p99 = {name: percentile(values, 0.99) * 1000 for name, values in latencies.items()}
    return Result(
        "commit-to-publish latency at idle (commit returned → a consumer has the event)",
        "; ".join(f"{name}: p50 {p50[name]:.1f} ms, p99 {p99[name]:.1f} ms" for name in latencies),
        "-",
        None,
        "p50 <= 20 ms",
        all(value <= 20 for value in p50.values()),
        {f"{name} p50 (ms)": value for name, value in p50.items()},
    )


def _latencies(run: Run, engine: Engine, size: Size, in_process: bool) -> list[float]:
    """Seconds from each commit to its event's arrival at a consumer of the event's queue."""
    app = ours_app(run)
    app.conf.amqp_events_outbox_relay = in_process
    app.declare_topology()
    store = app.outbox_store(engine=engine)
    store.create()
    relay = None if in_process else Relay(app.context, store)
    relaying = threading.Thread(target=relay.run, daemon=True) if relay is not None else None
    if relaying is not None:
        relaying.start()
    committed: dict[str, float] = {}
    arrived: dict[str, float] = {}

    def on_message(body: object, message: object) -> None:
        arrived[message.headers["id"]] = time.perf_counter()  # type: ignore[attr-defined]

    with Connection(run.url) as connection:
        queue = Queue("bench:bench.noop", no_declare=True)
        connection.Consumer(queue, callbacks=[on_message], no_ack=True).consume()
        listener = threading.Thread(target=_drain, args=(connection, lambda: len(arrived) >= size.latency_samples))
        listener.start()
        for n in range(size.latency_samples):
            with engine.begin() as database, app.outbox(database):
                event_id = app.fire("bench.noop", [n], {})
            committed[event_id] = time.perf_counter()
            time.sleep(0.05)  # idle between events
        listener.join(60)
    if relay is not None and relaying is not None:
        relay.stop()
        relaying.join(30)
    app.close()
    engine.dispose()
    return [arrived[event_id] - committed[event_id] for event_id in committed if event_id in arrived]


def _drain(connection: Connection, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 120
    while not done() and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            connection.drain_events(timeout=1)


def effect_throughput(bench: Bench, postgres: LocalPostgres, redis_url: str, size: Size) -> list[Result]:
    """A handler inserting one row per event, prefork -c 2: plain, through the inbox, with a Redis dedup store."""
    rates: dict[str, list[float]] = {"plain": [], "inbox": [], "redis": []}
    for repeat in range(size.repeats):
        for mode, values in rates.items():
            engine = postgres_database(postgres, f"effects_{mode}_{repeat}")
            with engine.begin() as connection:
                connection.exec_driver_sql("CREATE TABLE effects (id SERIAL PRIMARY KEY, n INTEGER)")
            InboxTable(engine).create()
            with bench.run(f"effects-{mode}") as run:
                app = ours_app(run)
                with app.connection_for_write() as connection:  # the queue of bench/apps/effects.py's handler
                    declare_topology(connection, service_topology("bench", ["bench.effect"], app.events_settings))
                with app.batch():
                    for n in range(size.drain):
                        app.fire("bench.effect", [n], {"last": n == size.drain - 1})
                app.close()
                env = {"DATABASE_URL": engine.url.render_as_string(False), "EFFECT_MODE": mode, "REDIS_URL": redis_url}
                with run.worker("effects", pool="prefork", concurrency=2, env=env):
                    marks = run.wait_marks(lambda marks: any(mark["last"] for mark in marks))
                values.append(throughput(marks, size.drain))
            engine.dispose()
    plain, inbox, redis = (median(values) for values in rates.values())
    return [
        Result(
            f"handling {size.drain:,} events whose handler inserts a row (PostgreSQL), -P prefork -c 2: the inbox",
            f"{inbox:,.0f} events/s",
            f"the same insert in the handler's own transaction: {plain:,.0f}/s",
            inbox / plain,
            ">= 0.8x without the inbox",
            inbox / plain >= 0.8,
            {"inbox": inbox, "no inbox": plain},
        ),
        Result(
            "the same handler with a Redis dedup store (looked up before the run, recorded after)",
            f"{redis:,.0f} events/s",
            f"without a dedup store: {plain:,.0f}/s",
            redis / plain,
            "reported",
            None,
            {"Redis dedup": redis, "no dedup": plain},
        ),
    ]
