"""Helpers of the ordered-handling tests: fire each account's events in sequence, check the order handled."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict

from amqp_events import PublishError

EVENTS = ("accounts.account.opened", "accounts.money.moved")


def fire_sequences(
    producer,
    accounts: list[str],
    per_account: int,
    failing: float,
    rng: random.Random,
    fired: dict | None = None,
    poison: frozenset[tuple[str, int]] = frozenset(),
    how: dict | None = None,
) -> dict[str, list[int]]:
    """Fire ``per_account`` events for each account, interleaved across accounts, alternating the two event
    names, each doing ``how`` (e.g. sleeping); ``failing`` of them fail once, those in ``poison`` (account, seq)
    until the fix is deployed.
    Records in ``fired`` each account's sequence numbers in the order fired (confirmed); an event whose fire
    raised is fired again under the same id, before the next."""
    fired = defaultdict(list) if fired is None else fired
    plan = [(account, seq) for seq in range(per_account) for account in accounts]
    for account, seq in plan:
        what = dict(how or {})
        if rng.random() < failing:
            what["fail_times"] = 1
        if (account, seq) in poison:
            what = {"permanent": True}
        event_id = None
        while True:
            try:
                producer.fire(
                    EVENTS[seq % 2],
                    kwargs={"account": account, "seq": seq, "how": what},
                    key=account,
                    event_id=event_id,
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
