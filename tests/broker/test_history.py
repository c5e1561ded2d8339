"""The event history on a RabbitMQ stream: recorded, searched, kept by size, and replayed to a service that
catches up, through a replay killed and a broker restarted, each event's effect once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone

import pytest
from helpers import TESTS, effects_tables
from sqlalchemy import func, select, text

from amqp_events import events_app
from amqp_events.errors import TopologyMissing
from amqp_events.exporter import Exporter
from amqp_events.history import Query
from amqp_events.testing import wait_for


@pytest.fixture
def effects_db(postgres_url):
    with effects_tables(postgres_url) as engine:
        yield engine


def effects(engine) -> tuple[int, int]:
    """Rows of the effects table, and distinct events among them."""
    with engine.connect() as connection:
        rows = connection.execute(select(func.count()).select_from(text("effects"))).scalar_one()
        distinct = connection.execute(text("select count(distinct event_id) from effects")).scalar_one()
    return rows, distinct


def fire_entries(app, first: int, count: int, accounts: int = 100, both: bool = False) -> None:
    """Events ``first``.. of 100 accounts; ``both``: every other one is ``ledger.posted`` (handled in order)."""
    with app.batch():
        for n in range(first, first + count):
            name = "ledger.posted" if both and n % 2 else "ledger.entry"
            app.fire(name, kwargs={"account": f"a{n % accounts}", "n": n}, key=f"a{n % accounts}")


def runs_by_account(engine) -> dict[str, list[int]]:
    """The ``ledger.posted`` effects' numbers by account, in the order they were written (odd numbers)."""
    with engine.connect() as connection:
        rows = connection.execute(text("select tag from effects order by id")).scalars().all()
    runs: dict[str, list[int]] = {}
    for tag in rows:
        account, n = tag.split(":")
        if int(n) % 2:
            runs.setdefault(account, []).append(int(n))
    return runs


def replay_command(broker_url: str, database: str, *arguments: str) -> subprocess.Popen:
    env = {**os.environ, "BROKER_URL": broker_url, "DATABASE_URL": database, "PYTHONPATH": str(TESTS)}
    argv = [sys.executable, "-m", "amqp_events.cli", "-A", "services.catchup", "history", "replay", *arguments]
    return subprocess.Popen(argv, env=env, cwd=TESTS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    return out


def queued(producer, queue: str) -> int:
    """Messages in ``queue`` (0 while it does not exist yet)."""
    try:
        return producer.transport.count(queue)
    except TopologyMissing:
        return 0


@pytest.mark.slow
def test_a_new_service_catches_up_on_10000_past_events_while_2000_more_are_fired(
    broker_url, worker, postgres_url, effects_db, producer
):
    """Half the events go to an ordered handler: each account's run in the order fired, across the seam."""
    teller = events_app("teller", broker_url=broker_url, amqp_events_history=True)
    teller.declare_topology()
    started = datetime.now(timezone.utc)
    fire_entries(teller, 0, 10_000, both=True)
    replay = replay_command(broker_url, postgres_url, "--since", started.isoformat(), "--rate", "2000", "--yes")
    # Once its partitions hold the command that closes their gates, the service's workers may start.
    wait_for(lambda: queued(producer, "catchup.ordered.00") >= 1, 60, what="the replay's gates closed")
    worker("catchup", pool="threads", concurrency=4, env={"DATABASE_URL": postgres_url})
    live = threading.Thread(
        target=lambda: [fire_entries(teller, n, 100, both=True) for n in range(10_000, 12_000, 100)]
    )
    live.start()
    out = finished(replay)
    live.join(120)
    assert "replayed" in out
    wait_for(lambda: effects(effects_db)[1] >= 12_000, 300, what="every event handled")
    assert effects(effects_db) == (12_000, 12_000)
    runs = runs_by_account(effects_db)
    assert all(numbers == sorted(numbers) for numbers in runs.values())
    assert sum(map(len, runs.values())) == 6000
    teller.close()


def test_an_interrupted_replay_goes_on_where_it_stopped_after_a_broker_restart(
    rabbitmq, broker_url, worker, postgres_url, effects_db, producer, service_app, monkeypatch
):
    if rabbitmq.node is None:
        pytest.skip("needs the harness's own node (not $AMQP_URL) to restart it")
    teller = events_app("teller", broker_url=broker_url, amqp_events_history=True)
    teller.declare_topology()
    since = (datetime.now(timezone.utc) - timedelta(seconds=5)).isoformat()
    fire_entries(teller, 0, 3000)
    teller.close()
    monkeypatch.setenv("DATABASE_URL", postgres_url)  # read when the service's module is imported
    replay = replay_command(broker_url, postgres_url, "--since", since, "--rate", "200", "--yes")
    try:
        wait_for(
            lambda: queued(producer, "catchup.history.cursor") >= 1 or replay.poll() is not None,
            120,
            what="a first checkpoint",
        )
    finally:
        replay.send_signal(signal.SIGKILL)
        out, err = replay.communicate(timeout=10)
    assert replay.returncode == -signal.SIGKILL, err  # killed mid-replay, not ended on its own
    exporter = Exporter(service_app("catchup"), rabbitmq.management)
    exporter.collect_once()
    [position] = {family.name: family for family in exporter.collect()}[
        "amqp_events_history_replay_position_age_seconds"
    ].samples
    assert position.labels == {"service": "catchup"} and 0 <= position.value < 120  # the interrupted replay's
    rabbitmq.node.stop()
    rabbitmq.node.start()
    out = finished(replay_command(broker_url, postgres_url, "--since", since, "--rate", "0", "--yes"))
    assert "going on from offset" in out, out
    worker("catchup", pool="threads", concurrency=4, env={"DATABASE_URL": postgres_url})
    wait_for(lambda: effects(effects_db)[1] >= 3000, 180, what="every event handled")
    assert effects(effects_db) == (3000, 3000)


def test_the_history_drops_its_oldest_events_past_its_size(broker_url, cli):
    teller = events_app(
        "teller", broker_url=broker_url, amqp_events_history={"max_bytes": 100_000, "segment_bytes": 20_000}
    )
    teller.declare_topology()
    fire_entries(teller, 0, 2000)
    teller.close()

    def stats() -> dict:
        result = cli("history", "stats", "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    # A reading that found the stream empty (first_offset None) is asked again, as one that found nothing dropped.
    # The node drops segments in a process of its own after a segment rolls over: late on a loaded machine.
    kept = wait_for(lambda: ((found := stats())["first_offset"] or 0) > 0 and found, 90, what="old segments dropped")
    assert 0 < kept["events"] < 2000
    newest = json.loads(cli("history", "find", "--where", "n=1999").output)
    assert newest["offset"] == kept["last_offset"]  # the newest are kept
    assert kept["bytes"] <= 100_000 + 2 * 20_000  # retention drops whole segments


def test_find_show_and_stats_print_json_and_the_exporter_tells_the_history_s_age(broker_url, cli_process, rabbitmq):
    teller = events_app("teller", broker_url=broker_url, amqp_events_history=True)
    teller.declare_topology()
    paid = teller.event("billing.invoice.paid")(lambda invoice_id, amount: None)
    ids = [paid(n, f"{n}.00") for n in range(3)]
    teller.fire("billing.invoice.voided", kwargs={"invoice_id": 1})
    teller.fire("shop.order.placed", kwargs={"order_id": 7}, key="7")
    exporter = Exporter(teller, rabbitmq.management)

    def collected() -> dict:
        exporter.collect_once()
        return {family.name: family.samples for family in exporter.collect()}

    def counted(found: dict) -> bool:  # the management API counts a new stream's messages after a few seconds
        return any(sample.value == 5 for sample in found["amqp_events_history_events"])

    exported = wait_for(lambda: (found := collected()) and counted(found) and found, 30)
    teller.close()
    assert exported["amqp_events_history_events"][0].value == 5
    assert exported["amqp_events_history_max_age_seconds"][0].value == 7 * 86400
    assert 0 <= exported["amqp_events_history_oldest_event_age_seconds"][0].value < 60
    assert exported["amqp_events_history_replay_position_age_seconds"] == []  # no replay under way

    found = cli_process("history", "find", "--event", "billing.#", "--where", "invoice_id=1")
    assert found.exit_code == 0, found.output
    lines = [json.loads(line) for line in found.output.splitlines()]
    assert [(line["event"], line["arguments"]["invoice_id"]) for line in lines] == [
        ("billing.invoice.paid", 1),
        ("billing.invoice.voided", 1),
    ]
    assert lines[0]["fired_by"] == "" and lines[0]["id"] == ids[1]  # the tests' shared user verifies nobody
    keyed = json.loads(cli_process("history", "find", "--where", "key=7").output)
    assert (keyed["event"], keyed["key"]) == ("shop.order.placed", "7")

    shown = cli_process("history", "show", ids[2])
    assert json.loads(shown.output)["headers"]["task"] == "billing.invoice.paid"
    missing = cli_process("history", "show", "no-such-id")
    assert missing.exit_code == 1 and "no event 'no-such-id' in the history" in missing.output

    stats = json.loads(cli_process("history", "stats", "--json").output)
    assert stats["events"] == 5
    assert sorted((row["event"], row["events"]) for row in stats["per_hour"]) == [
        ("billing.invoice.paid", 3),
        ("billing.invoice.voided", 1),
        ("shop.order.placed", 1),
    ]


def test_a_replay_without_an_inbox_asks_first_and_says_where_history_is_missing(broker_url, cli):
    no_history = cli("history", "replay", "--since", "1h", "--yes")
    assert no_history.exit_code == 1 and "amqp_events.history" in no_history.output
    teller = events_app("teller", broker_url=broker_url, amqp_events_history=True)
    teller.declare_topology()
    teller.close()
    refused = cli("history", "replay", "--since", "1h")
    assert refused.exit_code != 0 and "effects may repeat" in refused.output
    unknown = cli("history", "replay", "--since", "1h", "--handler", "nobody", "--yes")
    assert unknown.exit_code == 1 and "no handler 'nobody'" in unknown.output


def test_the_history_is_recorded_and_replayed_to_one_service_alike_in_both_modes(mode, records):
    mode.start("orders", "shipping", env={"HISTORY": "1"})
    since = mode.module("orders").app.context.clock.now()
    ids = [mode.producer.fire("test.ping", [f"h{n}"], {}) for n in range(3)]
    mode.quiet(("orders", "shipping"))
    orders = mode.module("orders").app
    found = orders.history().find(Query(since=since, events="test.*"))
    assert [event.id for event in found if event.id in ids] == ids  # (the others: the barriers of quiet())
    report = orders.history().replay(Query(since=since, where={"tag": "h1"}), handler="on_ping").run()
    assert report.replayed == 1
    mode.until(lambda: len(records.all(id=ids[1], service="orders")) == 2)
    mode.quiet(("orders", "shipping"))
    assert [len(records.all(id=event_id, service="orders")) for event_id in ids] == [1, 2, 1]
    assert [len(records.all(id=event_id, service="shipping")) for event_id in ids] == [1, 1, 1]


def test_a_live_event_fired_during_a_replay_to_an_ordered_handler_runs_after_its_keys_past(mode, records):
    """The replay's gates hold the live event until the replayed ones of its key ran, in both modes."""
    mode.start("ledger", env={"HISTORY": "1"})
    ledger = mode.module("ledger").app
    since = ledger.context.clock.now()
    for seq in range(3):
        mode.producer.fire("accounts.money.moved", kwargs={"account": "A", "seq": seq}, key="A")
    mode.until(lambda: len(records.all(service="ledger", account="A")) == 3)
    fired_live = []

    def fire_live(offset: int, end: int) -> None:
        if not fired_live:  # once the replay is under way
            fired_live.append(mode.producer.fire("accounts.money.moved", kwargs={"account": "A", "seq": 3}, key="A"))

    report = ledger.history().replay(Query(since=since, events="accounts.#")).run(fire_live)
    assert (report.replayed, report.partitions_existed) == (3, True)
    mode.until(lambda: len(records.all(service="ledger", account="A")) == 7)
    assert [run["seq"] for run in records.all(service="ledger", account="A")] == [0, 1, 2, 0, 1, 2, 3]
