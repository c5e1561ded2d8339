"""Replay batches on the wire (:mod:`amqp_events.wire.batch`): what goes into one, and reading one back."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from kombu.utils.json import dumps, loads

from amqp_events.wire.batch import REPLAY_BATCH, batch_message, entry, events_of, is_batch

HEADERS = {"task": "test.ping", "id": "e1", "retries": 0, "fired_at": "2026-11-25T10:00:00+00:00"}


def test_a_batch_carries_each_event_s_headers_and_body_as_they_were():
    moment = datetime(2026, 11, 25, 10, 0, tzinfo=timezone.utc)
    bodies = [dumps([["a"], {"at": moment}, None]).encode(), dumps([[], {"n": 2}, {"chain": None}]).encode()]
    entries = [entry({**HEADERS, "id": f"e{n}"}, body) for n, body in enumerate(bodies)]
    message = batch_message("orders:test.ping", "test.ping", entries, {"history_replay": "r1"})
    assert (message.exchange, message.routing_key, message.content_type) == (
        "orders.direct",
        "orders:test.ping",
        "application/json",
    )
    assert message.headers["task"] == "test.ping" and message.headers[REPLAY_BATCH] == 2 and is_batch(message.headers)
    assert message.headers["history_replay"] == "r1" and message.message_id == message.headers["id"]
    first, second = events_of("test.ping", loads(message.body))  # as a worker decodes it (kombu's JSON)
    assert (first.id, first.args, first.kwargs) == ("e0", ["a"], {"at": moment})
    assert (second.id, second.args, second.kwargs) == ("e1", [], {"n": 2})
    assert first.headers == {**HEADERS, "id": "e0"}


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        (HEADERS, b'{"data": {"n": 1}}'),  # a CloudEvent's data, not a task body
        (HEADERS, b"not json"),
        ({**HEADERS, "when": datetime(2026, 1, 1)}, b"[[], {}, null]"),  # a header JSON cannot carry
    ],
    ids=["not-a-task-body", "not-json", "header-not-json"],
)
def test_an_event_that_cannot_go_into_a_batch_is_sent_alone(headers, body):
    assert entry(headers, body) is None


@pytest.mark.parametrize(
    ("decoded", "error"),
    [
        ([], "not a list of events"),
        ({"headers": {}}, "not a list of events"),
        ([{"headers": HEADERS, "body": "text"}], "event 0 of a replay batch is not"),
        ([{"body": [[], {}, None]}], "event 0 of a replay batch is not"),
        ([{"headers": {**HEADERS, "task": "other.event"}, "body": [[], {}, None]}], "is a 'other.event'"),
    ],
    ids=["empty", "not-a-list", "bad-body", "no-headers", "another-event"],
)
def test_a_batch_that_is_not_one_says_what_is_wrong(decoded, error):
    with pytest.raises(ValueError, match=error):
        events_of("test.ping", json.loads(json.dumps(decoded)))


def test_only_a_message_with_the_batch_header_is_a_batch():
    assert not is_batch(HEADERS) and not is_batch(None) and not is_batch({})
