"""The history's pure parts: reading events, choosing them, its settings and topology, the replay's gate."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from amqp_events.history import HistoricEvent, Query, parse_where, topic_matches
from amqp_events.history.replay import Cursor, ahead_of_rate
from amqp_events.ordering.sequences import Gate, Sequence, through_gate, without_gate_marks
from amqp_events.settings import Settings
from amqp_events.topology import service_topology
from amqp_events.topology.history import max_age_seconds
from amqp_events.transport.base import StoredMessage
from amqp_events.wire.message import JSON, event_envelope, json_body
from amqp_events.wire.parked import HISTORY_REPLAY, HOLD_LIVE, RELEASE_PARKED, RELEASED_BEHIND, RELEASED_LAST

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


def fired(name: str, args=(), kwargs=None, at: datetime = NOW, key: str | None = None, offset: int = 0):
    headers, body = event_envelope(name, list(args), kwargs or {}, "teller", at, key=key)
    return HistoricEvent.read(offset, StoredMessage(headers, json_body(body), JSON, "utf-8"))


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("billing.#", "billing.invoice.paid", True),
        ("billing.#", "billing", True),
        ("billing.*", "billing.invoice.paid", False),
        ("billing.*.paid", "billing.invoice.paid", True),
        ("#.paid", "billing.invoice.paid", True),
        ("#", "anything.at.all", True),
        ("billing.invoice.paid", "billing.invoice.voided", False),
        ("*", "billing.invoice", False),
    ],
)
def test_an_event_pattern_matches_as_a_topic_binding_would(pattern, name, matches):
    assert topic_matches(pattern, name) is matches


def test_a_celery_message_is_read_with_its_arguments_named():
    event = fired("billing.invoice.paid", [42], {"amount": "10.00"}, key="42", offset=7)
    assert (event.offset, event.event, event.key, event.fired_by, event.at) == (
        7,
        "billing.invoice.paid",
        "42",
        "teller",
        NOW,
    )
    assert event.fields(("invoice_id", "amount")) == {"invoice_id": 42, "amount": "10.00"}
    assert event.fields() == {"0": 42, "amount": "10.00"}
    assert event.summary(("invoice_id",))["arguments"] == {"invoice_id": 42, "amount": "10.00"}


def test_a_cloud_event_is_read_from_its_attributes():
    headers = {
        "cloudEvents:specversion": "1.0", "cloudEvents:id": "ce-1", "cloudEvents:source": "node-shop",
        "cloudEvents:type": "shop.order.placed", "cloudEvents:time": "2026-11-25T12:00:00Z",
        "cloudEvents:partitionkey": "o-7",
    }  # fmt: skip
    event = HistoricEvent.read(0, StoredMessage(headers, b'{"order_id": 7}', JSON, None))
    assert (event.id, event.event, event.key, event.fired_by, event.at) == (
        "ce-1",
        "shop.order.placed",
        "o-7",
        "node-shop",
        NOW,
    )
    assert event.fields() == {"order_id": 7}


def test_a_body_that_is_not_json_is_listed_without_arguments():
    headers, _ = event_envelope("x.y", [], {}, "teller", NOW)
    event = HistoricEvent.read(0, StoredMessage(headers, b"\x80\x04pickle", "application/x-python-serialize", "binary"))
    assert (event.event, event.args, event.kwargs, event.summary()["arguments"]) == ("x.y", None, None, None)


def test_a_delayed_fire_entered_the_history_when_it_was_due():
    headers, body = event_envelope("x.y", [], {}, "teller", NOW)
    headers["due_at"] = (NOW + timedelta(hours=1)).isoformat()
    event = HistoricEvent.read(0, StoredMessage(headers, json_body(body), JSON, "utf-8"))
    assert event.at == NOW + timedelta(hours=1)


def test_a_query_takes_its_window_names_and_arguments():
    event = fired("billing.invoice.paid", [42], {"amount": "10.00"}, key="42")
    names = ("invoice_id", "amount")
    assert Query().matches(event)
    assert Query(since=NOW, until=NOW + timedelta(seconds=1)).matches(event)
    assert not Query(since=NOW + timedelta(seconds=1)).matches(event)
    assert not Query(until=NOW).matches(event)  # until is exclusive
    assert Query(events="billing.#").matches(event) and not Query(events="shop.#").matches(event)
    assert Query(where={"invoice_id": "42", "key": "42"}).matches(event, names)
    assert Query(where={"amount": '"10.00"'}).matches(event, names)  # as JSON too
    assert not Query(where={"invoice_id": "43"}).matches(event, names)
    assert not Query(where={"nothing": "1"}).matches(event, names)


def test_conditions_are_name_equals_value():
    assert parse_where(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_where(["a"])


def test_history_settings_take_a_dict_of_retention_and_are_checked():
    settings = Settings.from_raw({"amqp_events_history": {"max_age": "30D", "max_bytes": 0}})
    assert (settings.history, settings.history_max_age, settings.history_max_bytes) == (True, "30D", 0)
    assert Settings.from_raw({"amqp_events_history": "yes"}).history is True
    with pytest.raises(ValueError, match="unknown key"):
        Settings.from_raw({"amqp_events_history": {"max_days": 3}})
    with pytest.raises(ValueError, match="history_max_age"):
        Settings(history_max_age="7 days")
    assert [max_age_seconds(age) for age in ("90s", "2h", "7D", "1M", "1Y")] == [90, 7200, 604800, 2592000, 31536000]


def test_a_service_with_history_declares_the_stream_bound_to_every_event_and_delayed_fire():
    without = service_topology("orders", ["a.b"], Settings())
    assert "amqp_events.history" not in [queue.name for queue in without.queues]
    topology = service_topology("orders", ["a.b"], Settings(history=True, history_max_bytes=10**9))
    stream = topology.queue("amqp_events.history")
    assert (stream.exchange.name, stream.routing_key) == ("events", "#")
    assert stream.queue_arguments == {
        "x-queue-type": "stream",
        "x-max-age": "7D",
        "x-max-length-bytes": 10**9,
        "x-stream-max-segment-size-bytes": 100 * 1024**2,
    }
    [delayed] = [binding for binding in topology.bindings if binding.destination is stream]
    assert (delayed.source.name, delayed.routing_key) == ("amqp_events.delivery", "*." * 22 + "event.#")
    cursor = topology.queue("orders.history.cursor")
    assert cursor.queue_arguments["x-max-length"] == 1 and cursor.queue_arguments["x-queue-type"] == "quorum"
    assert stream not in topology.event_queues


def test_a_cursor_resumes_only_an_unfinished_run_of_the_same_replay():
    query = Query(since=NOW, events="a.#")
    record = {"since": NOW.isoformat(), "until": None, "events": "a.#", "where": {}}
    assert Cursor("r1", record, None, 120).resumes(query, None)
    assert not Cursor("r1", record, None, 120, done=True).resumes(query, None)
    assert not Cursor("r1", record, "on_a", 120).resumes(query, None)
    assert not Cursor("r1", record, None, 120).resumes(Query(since=NOW), None)
    assert Cursor("r1", record, None, 120).resumes(Query(since=NOW + timedelta(minutes=3), events="a.#"), None)
    assert not Cursor("r1", record, None, 120).resumes(Query(since=NOW - timedelta(days=1), events="a.#"), None)


@pytest.mark.parametrize(
    ("headers", "gate", "expected"),
    [
        ({HOLD_LIVE: "r1"}, None, Gate.HOLD),
        ({"id": "e1"}, None, Gate.PASS),
        ({"id": "e1"}, "r1", Gate.WAIT),
        ({"id": "e1", HISTORY_REPLAY: "r1"}, "r1", Gate.PASS),
        ({"id": "e1", HISTORY_REPLAY: "r0"}, "r1", Gate.WAIT),  # an older replay's copy: a duplicate, it waits
        ({"id": "e1", RELEASED_BEHIND: "r1"}, "r1", Gate.PASS),
        ({RELEASE_PARKED: "r1"}, "r1", Gate.OPEN),
        ({RELEASE_PARKED: "head-of-a-key"}, "r1", Gate.PASS),
    ],
)
def test_a_partition_s_gate_holds_what_did_not_come_from_its_replay(headers, gate, expected):
    assert through_gate(None if gate is None else Sequence(gate), headers) is expected


def test_the_gate_s_release_marks_are_not_its_key_s():
    gate = Sequence("r1")
    released = {"id": "e1", RELEASED_BEHIND: "r1", RELEASED_LAST: True}
    assert without_gate_marks(gate, released) == {"id": "e1"}
    behind_a_key = {"id": "e1", RELEASED_BEHIND: "head", RELEASED_LAST: True}
    assert without_gate_marks(gate, behind_a_key) == behind_a_key


def test_a_replay_keeps_to_its_rate_and_never_asks_for_a_negative_wait():
    assert ahead_of_rate(400, 400.0, 0.5) == pytest.approx(0.5)  # a second's worth sent in half a second
    assert ahead_of_rate(400, 400.0, 1.0) == 0.0
    assert ahead_of_rate(400, 400.0, 7.0) == 0.0  # behind (a busy machine): no wait, never a negative one
    assert ahead_of_rate(10_000, 0.0, 0.0) == 0.0  # no rate: as fast as the broker confirms
