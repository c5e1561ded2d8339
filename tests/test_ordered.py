"""Ordered handling per key on a real broker: one account's events handled in the order fired, through retries,
workers killed and the broker restarted, whatever the pool."""

from __future__ import annotations

import itertools
import random
import threading
from collections import defaultdict

import pytest

from amqp_events import PublishError, events_app
from amqp_events.testing import wait_for

EVENTS = ("accounts.account.opened", "accounts.money.moved")


def fire_sequences(
    producer, accounts: list[str], per_account: int, failing: float, rng: random.Random, fired: dict | None = None
) -> dict[str, list[int]]:
    """Fire ``per_account`` events for each account, interleaved across accounts, alternating the two event
    names; ``failing`` of them fail once. Records in ``fired`` each account's sequence numbers in the order
    fired (confirmed); an event whose fire raised is fired again under the same id, before the next."""
    fired = defaultdict(list) if fired is None else fired
    plan = [(account, seq) for seq in range(per_account) for account in accounts]
    for account, seq in plan:
        how = {"fail_times": 1} if rng.random() < failing else {}
        event_id = None
        while True:
            try:
                producer.fire(
                    EVENTS[seq % 2], kwargs={"account": account, "seq": seq, "how": how}, key=account, event_id=event_id
                )
                break
            except PublishError as error:  # the broker restarts: the event may or may not be there
                event_id = error.event_ids[0]
        fired[account].append(seq)
    return fired


def check_order(records, fired: dict[str, list[int]]) -> int:
    """Every account's events were handled in the order fired: no run of an event before the successful run
    of the one fired before it. Returns how many runs there were beyond one success per event."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for run in records.all(service="ledger"):
        runs[run["account"]].append(run)
    extra = 0
    for account, sequence in fired.items():
        handled = runs[account]
        first_success = {}
        for index, run in enumerate(handled):
            if run["ok"]:
                first_success.setdefault(run["seq"], index)
        assert sorted(first_success) == sorted(sequence), f"{account}: not every event succeeded"
        assert sorted(first_success, key=first_success.get) == sequence, f"{account}: handled out of order"
        for earlier, later in itertools.pairwise(sequence):
            first_run_of_later = next(index for index, run in enumerate(handled) if run["seq"] == later)
            assert first_run_of_later > first_success[earlier], f"{account}: {later} ran before {earlier} succeeded"
        extra += len(handled) - len(sequence)
    return extra


def all_succeeded(records, fired) -> bool:
    done = {(run["account"], run["seq"]) for run in records.all(service="ledger") if run["ok"]}
    return all((account, seq) in done for account, sequence in fired.items() for seq in sequence)


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
