"""Archive entries read back from headers and bodies: pure, no broker."""

from __future__ import annotations

import json
import pickle

from amqp_events import Reason
from amqp_events.archive import ArchivedMessage, Selection, replay_message
from amqp_events.wire.archived import Delivered, Failure, archived_message
from amqp_events.wire.message import StoredMessage


def archived(body: bytes, content_type: str = "application/json", **headers: object) -> ArchivedMessage:
    delivered = Delivered(
        headers={"task": "a.b", "id": "e1", "retries": 3, "x-death": [{"queue": "q"}], **headers},
        body=body,
        content_type=content_type,
        content_encoding="utf-8",
        exchange="events",
        routing_key="a.b",
        queue="orders:a.b",
    )
    failure = Failure.from_exception(Reason.MAX_RETRIES, ValueError("boom" * 1000), attempts=4)
    message = archived_message(delivered, failure, "orders", "orders.handlers.on_a")
    return ArchivedMessage.of(
        StoredMessage(message.headers, message.body, message.content_type, message.content_encoding)
    )


def test_an_archived_message_keeps_body_and_reason_and_bounds_the_exception_text():
    entry = archived(b'[[1], {"k": "v"}, {}]')
    assert (entry.id, entry.event, entry.service, entry.reason, entry.attempts) == (
        "e1",
        "a.b",
        "orders",
        "max_retries",
        4,
    )
    assert entry.payload == [[1], {"k": "v"}, {}]
    assert entry.exception_type == "builtins.ValueError" and len(entry.exception_message) <= 1000
    assert entry.queue == "orders:a.b" and entry.handler == "orders.handlers.on_a"


def test_payload_is_none_for_anything_but_readable_json():
    assert archived(pickle.dumps([1]), "application/x-python-serialize").payload is None  # never unpickled
    assert archived(b"{not json").payload is None
    assert archived(b"[" * 100_000 + b"]" * 100_000).payload is None  # found by the fault suite: RecursionError


def test_export_form_round_trips_binary_bodies():
    entry = archived(b"\xff\xfe binary", "application/octet-stream")
    again = ArchivedMessage.from_json(json.loads(json.dumps(entry.to_json())))
    assert again.body == entry.body and again.reason == entry.reason and again.id == entry.id


def test_a_replay_resets_the_retry_count_and_drops_broker_history():
    message = replay_message(archived(b"[[], {}, {}]"))
    assert message.routing_key == "orders:a.b" and message.exchange == "orders.direct"
    assert message.headers["retries"] == 0
    assert not any(key.startswith(("x-", "archive_")) for key in message.headers)


def test_selection_matches_every_given_criterion():
    entry = archived(b"[[], {}, {}]")
    assert Selection.of(event="a.b", reason="max_retries").matches(entry)
    assert not Selection.of(ids=["other"]).matches(entry)
    assert not Selection.of(reason="worker_lost").matches(entry)


def test_a_named_handler_s_entry_is_listed_under_its_event():
    entry = archived(b"[[1], {}, {}]", task="user.created:welcome_email")
    assert (entry.event, entry.summary()["event"]) == ("user.created", "user.created")
    assert Selection.of(event="user.created").matches(entry)
