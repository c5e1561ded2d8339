"""Moving a service between queue layouts with ``amqp-events topology move``: its waiting events, its retries on
the delay ladder and its archived events each reach the handler they are for, once, in the new layout."""

from __future__ import annotations

import pytest
from helpers import unconsumed, wait_archived

from amqp_events.testing import wait_for

pytestmark = pytest.mark.broker

PER_SERVICE = {"AMQP_EVENTS_QUEUE_LAYOUT": "per_service"}
PER_HANDLER = {"AMQP_EVENTS_QUEUE_LAYOUT": "per_handler"}
#: Seconds a retry waits on the delay ladder: longer than stopping the worker and moving take on a loaded machine.
RETRY_WAIT = 45


def runs(records, event_id: str, handler: str) -> list[int]:
    return [run["attempt"] for run in records.all(id=event_id, service=handler)]


@pytest.mark.timeout(300)
def test_a_move_to_the_per_service_layout_and_back_loses_nothing_and_runs_nothing_twice(
    worker, producer, records, cli_process
):
    old = worker("accounts", env=PER_HANDLER)
    # Retries of each handler waiting on the ladder, addressed to its own queue by name, through the move (their
    # wait is longer than stopping the worker and moving takes); an archived event.
    later_unnamed = producer.fire("test.ping", ["later-1"], {"how": {"countdown": RETRY_WAIT, "only": "accounts"}})
    later_named = producer.fire("test.ping", ["later-2"], {"how": {"countdown": RETRY_WAIT, "only": "accounts.audit"}})
    archived = producer.fire("test.ping", ["archived"], {"how": {"permanent": True, "only": "accounts.audit"}})
    [entry] = wait_archived(producer.archive("accounts"), 1)
    assert entry.queue == "accounts:test.ping:audit"
    wait_for(lambda: len(records.all(id=later_named)) == 2, 30, what="the first runs of the retried events")
    old.stop()
    for queue in ("accounts:test.ping", "accounts:test.ping:audit"):
        unconsumed(producer, queue)  # the move refuses a queue that is still read
    backlog = [producer.fire("test.ping", [f"waiting-{n}"], {}) for n in range(5)]  # in both old queues

    moved = cli_process("topology", "move", "--yes", app="services.accounts", env=PER_SERVICE)
    assert moved.exit_code == 0, moved.output
    assert "moved 5 message(s) out of accounts:test.ping\n" in moved.output, "a retry left the ladder before the move"
    assert "deleted accounts:test.ping:audit" in moved.output
    checked = cli_process("topology", "check", app="services.accounts", env=PER_SERVICE)
    assert checked.exit_code == 0, checked.output
    assert "note binding 'accounts.direct -> accounts.events (accounts:test.ping:audit)'" in checked.output

    new = worker("accounts", env=PER_SERVICE)
    for event_id in backlog:
        wait_for(lambda e=event_id: runs(records, e, "accounts.audit") and runs(records, e, "accounts"), 30)
    wait_for(lambda: len(runs(records, later_unnamed, "accounts")) == 2, 90, what="the unnamed handler's retry")
    wait_for(lambda: len(runs(records, later_named, "accounts.audit")) == 2, 90, what="the named handler's retry")
    replayed = cli_process("archive", "replay", "--yes", app="services.accounts", env={**PER_SERVICE, "FIXED": "1"})
    assert replayed.exit_code == 0, replayed.output
    wait_for(lambda: len(runs(records, archived, "accounts.audit")) == 2, 30, what="the archived event replayed")
    new.stop()
    unconsumed(producer, "accounts.events")
    assert runs(records, later_unnamed, "accounts") == [1, 2] and runs(records, later_unnamed, "accounts.audit") == [1]
    assert runs(records, later_named, "accounts.audit") == [1, 2] and runs(records, later_named, "accounts") == [1]
    assert runs(records, archived, "accounts") == [1]
    for event_id in backlog:
        assert (runs(records, event_id, "accounts"), runs(records, event_id, "accounts.audit")) == ([1], [1])

    # And back: fired events waiting in the shared queue are for both handlers.
    back = [producer.fire("test.ping", [f"back-{n}"], {}) for n in range(3)]
    moved = cli_process("topology", "move", "--yes", app="services.accounts", env=PER_HANDLER)
    assert moved.exit_code == 0, moved.output
    assert "moved 3 message(s) out of accounts.events" in moved.output and "deleted accounts.events" in moved.output
    worker("accounts", env=PER_HANDLER)
    for event_id in back:
        wait_for(lambda e=event_id: runs(records, e, "accounts.audit") and runs(records, e, "accounts"), 30)
    records.barrier(producer, ("accounts", "accounts.audit"))
    for event_id in back:
        assert (runs(records, event_id, "accounts"), runs(records, event_id, "accounts.audit")) == ([1], [1])
