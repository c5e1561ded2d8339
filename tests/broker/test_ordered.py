"""Ordered handling per key on a real broker: one account's events handled in the order fired, through retries,
workers killed and the broker restarted, whatever the pool."""

from __future__ import annotations

import os
import random
import threading
from collections import defaultdict

import pytest
from helpers import scrape, value
from ordered_helpers import all_succeeded, check_order, fire_sequences

from amqp_events import events_app
from amqp_events.console.fleet import Fleet
from amqp_events.local.processes import free_port
from amqp_events.testing import wait_for
from amqp_events.topology.names import slot_of


@pytest.mark.parametrize(("pool", "coroutines"), [("solo", "0"), ("threads", "0"), ("prefork", "0"), ("threads", "1")])
def test_each_account_is_handled_in_order_through_retries_on_every_pool(pool, coroutines, worker, producer, records):
    """And with coroutine handlers, on the worker's event loop (``coroutines``)."""
    options = {"pool": pool, "concurrency": 1 if pool == "solo" else 3, "env": {"COROUTINES": coroutines}}
    workers = [worker("ledger", **options) for _ in range(2)]
    fired = fire_sequences(producer, [f"acct-{n}" for n in range(12)], 10, failing=0.15, rng=random.Random(7))
    wait_for(lambda: all_succeeded(records, fired), 120, what="every event handled")
    check_order(records, fired)
    assert all(w.is_running() for w in workers)
    for stopped in workers:  # a warm shutdown closes the partitions' channels without an error
        assert stopped.stop() == 0
        assert "ERROR" not in stopped.log(), stopped.log_tail()


@pytest.mark.slow
def test_order_holds_through_parking_a_worker_killed_and_the_broker_restarted(rabbitmq, worker, broker_url, records):
    """200 accounts x 50 events from two producers; 10% fail once, one account in 20 has an event that fails
    until a fix is deployed (its later events parked, then released in order by the archive's replay)."""
    if rabbitmq.node is None:
        pytest.skip("needs the harness's own node (not $AMQP_URL) to restart it")
    workers = [worker("ledger", pool="threads", concurrency=4) for _ in range(3)]
    accounts = [f"acct-{n}" for n in range(200)]
    rng = random.Random(26)
    poison = (
        frozenset((account, rng.randrange(5, 45)) for account in accounts[::20])
        if not os.environ.get("NOPOISON")
        else frozenset()
    )
    producers = [events_app(f"teller{n}", broker_url=broker_url, amqp_events_publish_timeout=60) for n in range(2)]
    fired: dict[str, list[int]] = defaultdict(list)
    threads = [
        threading.Thread(
            target=fire_sequences,
            args=(producer, accounts[n::2], 50, 0.1, random.Random(n), fired, poison),
            daemon=True,
        )
        for n, producer in enumerate(producers)
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(records.all(service="ledger")) > 1500, 120, what="handling under way")
    workers[0].kill()
    wait_for(lambda: len(records.all(service="ledger")) > 4000, 120, what="handling going on")
    rabbitmq.node.stop()
    rabbitmq.node.start()
    for thread in threads:
        thread.join(180)
    assert sum(map(len, fired.values())) == 10_000
    archive = producers[0].archive("ledger")
    wait_for(lambda: archive.count() >= len(poison), 300, what="the poisoned events archived")
    unpoisoned = {account: seqs for account, seqs in fired.items() if not any(p[0] == account for p in poison)}
    wait_for(lambda: all_succeeded(records, unpoisoned), 300, what="every event of the other accounts handled")
    assert not all_succeeded(records, fired)  # the parked ones wait

    for running in workers[1:]:
        running.stop()
    workers = [worker("ledger", pool="threads", concurrency=4, env={"FIXED": "1"}) for _ in range(3)]
    archive.replay()
    wait_for(lambda: all_succeeded(records, fired), 300, what="every event handled, the parked ones too")
    extra = check_order(records, fired)
    print(f"\n{sum(map(len, fired.values()))} events of {len(accounts)} accounts in order; {extra} extra runs")
    for producer in producers:
        producer.close()


def test_the_topology_shows_the_partitions_and_the_check_finds_those_left_over(worker, cli, records, monkeypatch):
    worker("ledger", env={"PARTITIONS": "4"})
    shown = cli("topology", "show", app="services.ledger")
    assert shown.exit_code == 0 and "ledger.ordered  (headers) alternate-exchange=ledger.ordered.intake" in shown.output
    assert "ledger.ordered -> ledger.ordered.03  [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63]" in (
        shown.output
    )
    monkeypatch.setenv("PARTITIONS", "2")  # an operator lowered amqp_events_partitions
    check = cli("topology", "check", app="services.ledger")
    assert "extra queue 'ledger.ordered.03'" in check.output and "extra queue 'ledger.ordered.01'" not in check.output


def test_the_archive_shows_which_keys_are_parked_and_how_many_events_wait(
    worker, producer, cli, cli_process, records, rabbitmq, vhost
):
    port = free_port()
    worker("ledger", env={"PARTITIONS": "4", "AMQP_EVENTS_METRICS_PORT": str(port)})
    head = producer.fire(
        "accounts.money.moved", kwargs={"account": "a-1", "seq": 0, "how": {"permanent": True}}, key="a-1"
    )
    for seq in (1, 2):
        producer.fire("accounts.money.moved", kwargs={"account": "a-1", "seq": seq}, key="a-1")
    partition = f"ledger.ordered.0{int(slot_of('a-1')) % 4}"
    parked = f"{partition}.parked"
    wait_for(lambda: producer.transport.count(parked) == 3, 30, what="a marker and two events parked")
    listed = cli("archive", "list", app="services.ledger")
    assert f"{head}" in listed.output and "non_retryable, parks key a-1" in listed.output
    shown = cli_process("archive", "parked", app="services.ledger")
    assert shown.exit_code == 0, shown.output
    assert [line.split() for line in shown.output.splitlines()[1:2]] == [["a-1", partition, head, "2"]]
    assert records.all(account="a-1") and not [run for run in records.all(account="a-1") if run["ok"]]
    assert value(scrape(port), "amqp_events_parked_keys", service="ledger", partition=partition) == 1
    assert Fleet(producer, rabbitmq.management, vhost).parked("ledger") == [  # what the console's archive page shows
        {"key": "a-1", "partition": partition, "head": head, "waiting": 2}
    ]


def test_parked_events_read_many_times_run_once_released_not_counted_as_lost(worker, producer, records):
    """A parked queue is read by browsing (each partition's take, each release): the broker counts every message
    handed out and back as a delivery. A released event must not carry those counts to its handler."""
    ledger = worker("ledger", env={"PARTITIONS": "4"})
    producer.fire("accounts.money.moved", kwargs={"account": "a-1", "seq": 0, "how": {"permanent": True}}, key="a-1")
    for seq in (1, 2):
        producer.fire("accounts.money.moved", kwargs={"account": "a-1", "seq": seq}, key="a-1")
    parked = f"ledger.ordered.0{int(slot_of('a-1')) % 4}.parked"
    wait_for(lambda: producer.transport.count(parked) == 3, 30, what="a marker and two events parked")
    for _ in range(12):  # more readings than amqp_events_max_redeliveries (10)
        with producer.transport.browse(parked) as messages:
            assert len(list(messages)) == 3
    ledger.stop()
    worker("ledger", env={"PARTITIONS": "4", "FIXED": "1"})
    producer.archive("ledger").replay()
    wait_for(lambda: sorted(run["seq"] for run in records.all(account="a-1", ok=True)) == [0, 1, 2], 60,
             what="the head replayed and the two parked events released, each handled")  # fmt: skip
    assert producer.archive("ledger").count() == 0  # none archived as worker_lost


def test_the_partitions_are_shared_out_among_the_workers_and_order_holds_through_each_hand_over(
    worker, producer, records
):
    workers = [worker("ledger", pool="threads", concurrency=2, env={"PARTITIONS": "8"}) for _ in range(3)]
    accounts = [f"acct-{n}" for n in range(48)]
    fired = fire_sequences(producer, accounts, 40, failing=0.05, rng=random.Random(11), how={"sleep": 0.02})
    wait_for(lambda: all_succeeded(records, fired), 180, what="every event handled")
    check_order(records, fired)
    runs = records.all(service="ledger")
    last_third = {run["pid"] for run in runs[2 * len(runs) // 3 :]}
    assert len(last_third) == 3, f"handled by {len(last_third)} worker(s) at the end: the partitions were not shared"
    assert all(w.is_running() for w in workers)
