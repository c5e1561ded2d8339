"""Exactly-once effects: the inbox (PostgreSQL and SQLite) and the dedup stores (Redis, SQL), with real workers."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import pytest
from helpers import TESTS, effect_count, effects_tables, publish_twice, wait_archived
from services.effects import metadata
from sqlalchemy import create_engine, func, insert, select

from amqp_events import events_app
from amqp_events.inbox.sql import InboxTable
from amqp_events.testing import wait_for


@pytest.fixture
def effects_db(database):
    """The test's database with the effects table and the inbox table."""
    with effects_tables(database) as engine:
        yield engine


@pytest.fixture
def payments(worker, database, effects_db, request):
    """``payments()`` starts a worker of the payments service on the test's database."""

    def start(*extra: str, env: dict[str, str] | None = None, **options):
        redis = {"REDIS_URL": request.getfixturevalue("redis_url")} if options.pop("redis", False) else {}
        return worker("payments", *extra, env={"DATABASE_URL": database, **redis, **(env or {})}, **options)

    return start


@pytest.mark.parametrize("event", ["pay.session", "pay.connection"])
def test_two_deliveries_of_one_event_and_one_other_make_two_effects(event, payments, producer, effects_db, records):
    process = payments()
    twice = publish_twice(producer, event, "twice")
    once = producer.fire(event, ["once"], {})
    wait_for(lambda: process.log().count("duplicate skipped") == 1, 30, what="the duplicate skipped")
    records.wait(2)
    # A run is recorded from inside the handler: its transaction (the effect and the inbox row) commits after.
    wait_for(lambda: effect_count(effects_db) == 2, 30, what="both effects committed")
    assert effect_count(effects_db, event_id=twice) == 1 and effect_count(effects_db, event_id=once) == 1
    assert f"duplicate skipped event={event} service=payments id={twice}" in process.log()


def test_a_duplicate_delivered_to_two_workers_at_once_has_one_effect(postgres_url, worker, producer, records, tmp_path):
    engine = create_engine(postgres_url)
    metadata.create_all(engine)
    InboxTable(engine).create()
    env = {"DATABASE_URL": postgres_url}
    first = worker("payments", pool="prefork", concurrency=2, env=env)
    second = worker("payments", pool="prefork", concurrency=2, env=env)
    rounds = 8
    ids = [publish_twice(producer, "pay.session", f"r{n}", {"sleep": 0.5}) for n in range(rounds)]
    wait_for(lambda: sum(w.log().count("duplicate skipped") for w in (first, second)) == rounds, 60, what="skips")
    for event_id in ids:
        assert effect_count(engine, event_id=event_id) == 1
    children = {worker.pid: set(worker.children()) for worker in (first, second)}
    ran_by = {run["id"]: next(main for main, pids in children.items() if run["pid"] in pids) for run in records.all()}
    skipped_by = {event_id: w.pid for w in (first, second) for event_id in ids if f"id={event_id}" in w.log()}
    across = sum(1 for event_id in ids if ran_by[event_id] != skipped_by.get(event_id))
    print(f"\n{rounds} events delivered twice at once: {effect_count(engine)} effects; twins on two workers: {across}")
    assert effect_count(engine) == rounds and across > 0  # the twins did meet on two workers
    engine.dispose()


def test_a_handler_that_raises_after_its_write_leaves_nothing_and_runs_again(payments, producer, effects_db, records):
    payments()
    event_id = producer.fire("pay.session", ["flaky"], {"how": {"fail_times": 1}})
    runs = records.wait(2, id=event_id)
    assert [run["attempt"] for run in runs] == [1, 2]  # the first run wrote, raised, and was rolled back
    wait_for(lambda: effect_count(effects_db, event_id=event_id) >= 1, 30, what="the retried run's effect committed")
    assert effect_count(effects_db, event_id=event_id) == 1


def test_replays_run_what_failed_skip_what_succeeded_and_run_again_with_a_new_id(
    payments, producer, database, effects_db, archive_of, cli, monkeypatch
):
    monkeypatch.setenv("DATABASE_URL", database)  # for the commands, which load the service's app
    first = payments()
    event_id = producer.fire("pay.session", ["bad"], {"how": {"permanent": True}})
    wait_archived(archive_of("payments"), 1)
    assert effect_count(effects_db) == 0  # the failed run was rolled back, its key with it
    exported = io.StringIO()
    archive_of("payments").export(exported)
    first.stop()
    fixed = payments(env={"FIXED": "1"})

    def replay(*options: str) -> None:
        archive_of("payments").load(io.StringIO(exported.getvalue()))  # the event in the archive (again)
        assert "replayed 1" in cli("archive", "replay", "--yes", *options, app="services.payments").output

    archive_of("payments").purge()
    replay()  # it failed: it runs
    wait_for(lambda: effect_count(effects_db, event_id=event_id) == 1, 30, what="the replay's effect")
    replay()  # it succeeded: skipped
    wait_for(lambda: "duplicate skipped" in fixed.log(), 30, what="the second replay skipped")
    replay("--new-id")  # on purpose, under a new id: it runs again
    wait_for(lambda: effect_count(effects_db) == 2, 30, what="the effect of the copy under a new id")
    assert effect_count(effects_db, event_id=event_id) == 1


def test_redis_dedup_skips_a_duplicate_after_success_and_runs_again_after_its_ttl(
    payments, producer, records, redis_url
):
    import redis

    process = payments(redis=True)
    event_id = publish_twice(producer, "mail.redis", "mail")
    wait_for(lambda: "duplicate skipped" in process.log(), 30, what="the duplicate skipped")
    assert len(records.all(id=event_id)) == 1
    key = f"amqp_events:done:payments:services.payments.on_mail_with_redis:{event_id}"
    client = redis.Redis.from_url(redis_url)
    wait_for(lambda: not client.exists(key), 20, what="the key's TTL (5 s) to pass")
    producer.transport.publish(
        producer.event_message("mail.redis", ["mail"], {"how": {}}).__class__(
            "events", "mail.redis", {"task": "mail.redis", "id": event_id}, [["mail"], {}, {}], event_id
        )
    )
    records.wait(2, id=event_id)  # documented: after the TTL a duplicate runs again
    client.close()


def test_sql_dedup_skips_a_duplicate_after_success(payments, producer, records):
    process = payments()
    event_id = publish_twice(producer, "mail.sql", "mail")
    wait_for(lambda: "duplicate skipped" in process.log(), 30, what="the duplicate skipped")
    assert len(records.all(id=event_id)) == 1


def test_keys_older_than_the_retention_are_pruned_by_the_worker_and_the_cli(
    database, effects_db, payments, cli_process
):
    table = InboxTable(effects_db).table
    with effects_db.begin() as connection:
        connection.execute(
            insert(table),
            [{"service": "payments", "handler": "h", "event_id": f"old-{n}", "processed_at": 0.0} for n in range(2500)]
            + [{"service": "payments", "handler": "h", "event_id": "new", "processed_at": 4e9}],
        )
    payments(env={"PRUNE_INTERVAL": "1", "INBOX_RETENTION": "3600"})

    def keys() -> int:
        with effects_db.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(table)).scalar_one())

    wait_for(lambda: keys() == 1, 30, what="the worker's pruning")
    # Ten minutes old: past the CLI's 60 s, within the running worker's 3600 s, so only the CLI prunes it.
    ten_minutes_ago = time.time() - 600
    with effects_db.begin() as connection:
        connection.execute(
            insert(table).values(service="payments", handler="h", event_id="old", processed_at=ten_minutes_ago)
        )
    initialised = cli_process("inbox", "init", "--db", database, app=None)  # an existing table: kept as it is
    assert initialised.returncode == 0, initialised.output
    pruned = cli_process("inbox", "prune", "--db", database, "--older-than", "60", app=None)
    assert "pruned 1 key(s)" in pruned.output and keys() == 1


def test_a_database_url_whose_driver_is_missing_is_a_one_line_error(cli_process):
    for command in ("inbox", "outbox"):
        done = cli_process(command, "init", "--db", "postgresql+psycopg2://shop@127.0.0.1/shop")
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert "No module named 'psycopg2': the database URL's driver is not installed" in done.stderr


def test_a_handler_with_an_inbox_must_take_its_handle():
    from amqp_events.inbox import Inbox

    app = events_app("payments")
    inbox = Inbox(create_engine("sqlite://"))
    with pytest.raises(TypeError, match="add a parameter for it"):

        @app.handler("pay.x", inbox=inbox)
        def on_pay() -> None: ...

    @app.handler("pay.y", inbox=inbox, bind=True)
    def on_pay_bound(self, session, amount: str) -> None: ...


def test_a_django_handler_with_the_django_inbox_writes_once(postgres_url, worker, producer, records):
    engine = create_engine(postgres_url)
    metadata.create_all(engine)
    migrate = (
        "import services.django_payments; from django.core.management import call_command; call_command('migrate')"
    )
    env = {"DATABASE_URL": postgres_url}
    done = subprocess.run(
        [sys.executable, "-c", migrate], env={**os.environ, **env, "BROKER_URL": "amqp://unused//"},
        cwd=TESTS, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    process = worker("django_payments", env=env)
    twice = publish_twice(producer, "pay.django", "twice")
    flaky = producer.fire("pay.django", ["flaky"], {"how": {"fail_times": 1}})
    wait_for(lambda: "duplicate skipped" in process.log(), 30, what="the duplicate skipped")
    assert [run["attempt"] for run in records.wait(2, id=flaky)] == [1, 2]
    # The run is recorded from inside the handler: its transaction (the effect and the inbox row) commits after.
    wait_for(lambda: effect_count(engine, event_id=flaky) >= 1, 30, what="the retried run's effect committed")
    assert effect_count(engine, event_id=twice) == 1 and effect_count(engine, event_id=flaky) == 1
    engine.dispose()
