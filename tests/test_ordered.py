"""Ordered handling per key on a real broker: one account's events handled in the order fired, through retries,
workers killed and the broker restarted, whatever the pool."""

from __future__ import annotations

import random
import threading
from collections import defaultdict

import pytest
from ordered_helpers import all_succeeded, check_order, fire_sequences

from amqp_events import events_app
from amqp_events.testing import wait_for


@pytest.mark.parametrize("pool", ["solo", "threads", "prefork"])
def test_each_account_is_handled_in_order_through_retries_on_every_pool(pool, worker, producer, records):
    options = {"pool": pool, "concurrency": 1 if pool == "solo" else 3}
    workers = [worker("ledger", **options) for _ in range(2)]
    fired = fire_sequences(producer, [f"acct-{n}" for n in range(12)], 10, failing=0.15, rng=random.Random(7))
    wait_for(lambda: all_succeeded(records, fired), 120, what="every event handled")
    check_order(records, fired)
    assert all(w.is_running() for w in workers)


@pytest.mark.slow
def test_order_holds_when_a_worker_is_killed_and_the_broker_restarts(rabbitmq, worker, broker_url, records):
    if rabbitmq.node is None:
        pytest.skip("needs the harness's own node (not $AMQP_URL) to restart it")
    workers = [worker("ledger", pool="threads", concurrency=4) for _ in range(3)]
    accounts = [f"acct-{n}" for n in range(60)]
    producers = [events_app(f"teller{n}", broker_url=broker_url, amqp_events_publish_timeout=60) for n in range(2)]
    fired: dict[str, list[int]] = defaultdict(list)
    threads = [
        threading.Thread(
            target=fire_sequences, args=(producer, accounts[n::2], 20, 0.1, random.Random(n), fired), daemon=True
        )
        for n, producer in enumerate(producers)
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(records.all(service="ledger")) > 200, 60, what="handling under way")
    workers[0].kill()
    wait_for(lambda: len(records.all(service="ledger")) > 500, 60, what="handling going on")
    rabbitmq.node.stop()
    rabbitmq.node.start()
    for thread in threads:
        thread.join(120)
    assert sum(map(len, fired.values())) == 1200
    wait_for(lambda: all_succeeded(records, fired), 180, what="every event handled")
    extra = check_order(records, fired)
    print(f"\n{sum(map(len, fired.values()))} events of {len(accounts)} accounts in order; {extra} extra runs")
    for producer in producers:
        producer.close()


def test_the_topology_shows_the_partitions_and_the_check_finds_those_left_over(worker, cli, records, monkeypatch):
    worker("ledger", env={"PARTITIONS": "4"})
    shown = cli("topology", "show", app="services.ledger")
    assert shown.exit_code == 0 and "ledger.ordered.00" in shown.output and "x-consistent-hash" in shown.output
    monkeypatch.setenv("PARTITIONS", "2")  # an operator lowered amqp_events_partitions
    check = cli("topology", "check", app="services.ledger")
    assert "extra queue 'ledger.ordered.03'" in check.output and "extra queue 'ledger.ordered.01'" not in check.output
