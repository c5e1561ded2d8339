"""The per-service queue layout (``amqp_events_queue_layout = "per_service"``): every handler of a service takes
its events from one queue, and each keeps its guarantees, in the in-process mode and on a real broker. (The whole
contract, tests/broker/test_contract.py, runs in this layout too: scripts/test.)"""

from __future__ import annotations

import pytest
from contract_modes import archived_in

from amqp_events.history import Query

PER_SERVICE = {"AMQP_EVENTS_QUEUE_LAYOUT": "per_service"}

pytestmark = pytest.mark.parametrize("mode", ["in_process", "broker"], indirect=True)


def test_an_archived_event_names_its_handler_and_its_replay_runs_that_one_alone(mode, records):
    mode.start("accounts", env=PER_SERVICE)
    fail_unnamed = mode.producer.fire("test.ping", ["unnamed"], {"how": {"permanent": True, "only": "accounts"}})
    fail_named = mode.producer.fire("test.ping", ["named"], {"how": {"permanent": True, "only": "accounts.audit"}})
    archived = {entry.id: entry for entry in archived_in(mode, "accounts", 2)}
    assert {event_id: (entry.handler, entry.queue) for event_id, entry in archived.items()} == {
        fail_unnamed: ("services.accounts.on_ping", "accounts.events"),
        fail_named: ("services.accounts.audit_ping", "accounts.events"),
    }
    mode.deploy_fix("accounts")
    assert sorted(mode.archive("accounts").replay().replayed) == sorted([fail_unnamed, fail_named])
    mode.until(lambda: len(records.all(id=fail_named, service="accounts.audit")) >= 2)
    mode.until(lambda: len(records.all(id=fail_unnamed, service="accounts")) >= 2)
    mode.quiet(("accounts", "accounts.audit"))
    assert [run["attempt"] for run in records.all(id=fail_named, service="accounts.audit")] == [1, 1]
    assert [run["attempt"] for run in records.all(id=fail_named, service="accounts")] == [1]
    assert [run["attempt"] for run in records.all(id=fail_unnamed, service="accounts")] == [1, 1]
    assert [run["attempt"] for run in records.all(id=fail_unnamed, service="accounts.audit")] == [1]
    assert mode.archive("accounts").count() == 0


def test_a_history_replay_into_one_handler_of_a_shared_queue_runs_that_one_alone(mode, records):
    mode.start("accounts", env={**PER_SERVICE, "HISTORY": "1"})
    accounts = mode.module("accounts").app
    since = accounts.context.clock.now()
    ids = [mode.producer.fire("test.ping", [f"h{n}"], {}) for n in range(3)]
    mode.quiet(("accounts", "accounts.audit"))
    one = accounts.history().replay(Query(since=since, where={"tag": "h1"}), handler="audit").run()
    both = accounts.history().replay(Query(since=since, where={"tag": "h2"})).run()
    assert (one.replayed, both.replayed) == (1, 2)
    mode.until(lambda: len(records.all(id=ids[2], service="accounts")) == 2)
    mode.until(lambda: len(records.all(id=ids[2], service="accounts.audit")) == 2)
    mode.until(lambda: len(records.all(id=ids[1], service="accounts.audit")) == 2)
    mode.quiet(("accounts", "accounts.audit"))
    assert [len(records.all(id=event_id, service="accounts.audit")) for event_id in ids] == [1, 2, 2]
    assert [len(records.all(id=event_id, service="accounts")) for event_id in ids] == [1, 1, 2]
