"""Archive entries read back from headers and bodies: pure, no broker."""

from __future__ import annotations

import json
import pickle

from hypothesis import given
from hypothesis import strategies as st

from amqp_events import Reason
from amqp_events.archive import ArchivedMessage, Selection, replay_message
from amqp_events.wire.archived import Delivered, Failure, archived_message
from amqp_events.wire.message import StoredMessage
from amqp_events.wire.trust import Identity


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


# -- what is believed of an entry, and what a replay goes by ----------------------------------------------------

#: Everything a sender could write to pass a message off as the victim's worker's or the broker's writing.
forged_values = st.one_of(
    st.sampled_from(["orders:test.refund", "test.refund", "orders", "max_retries", "expired", "rejected"]),
    st.text(max_size=20),
    st.integers(),
    st.lists(st.dictionaries(st.sampled_from(["queue", "reason", "count"]), st.text(max_size=20)), max_size=2),
)
forgeable = st.sampled_from(
    ["archive_queue", "archive_task", "archive_reason", "archive_service", "archive_handler", "archive_cut",
     "x-first-death-queue", "x-first-death-reason", "for_handler", "fired_as", "fired_by", "task"]
)  # fmt: skip


def dead_lettered(headers: dict, queue: str = "orders:a.b", user_id: str = "billing-u1") -> ArchivedMessage:
    """An entry the broker dead-lettered into orders' archive from ``queue`` (its expiration passed there)."""
    deaths = {"x-death": [{"queue": queue, "reason": "expired", "count": 1}], **headers}
    stored = StoredMessage(deaths, b'[[1070, "777777"], {}, null]', "application/json", "utf-8", user_id,
                           "orders.dead-letter", queue)  # fmt: skip
    return ArchivedMessage.of(stored, Identity("orders", "orders-u", {"billing-u1": "billing"}))


@given(st.dictionaries(forgeable, forged_values, max_size=8))
def test_of_an_entry_the_broker_dead_lettered_only_what_the_broker_verified_is_read(headers):
    entry = dead_lettered({"task": "a.b", "id": "e1", **headers})
    assert (entry.queue, entry.service, entry.fired_by, entry.task) == ("orders:a.b", "orders", "billing", "a.b")
    assert (entry.event, entry.reason, entry.cut, entry.dead_lettered) == ("a.b", Reason.EXPIRED, "", True)
    message = replay_message(entry, events_exchange="events")
    assert (message.exchange, message.routing_key) == ("orders.direct", "orders:a.b")
    assert message.headers["task"] == message.headers["for_handler"] == "a.b"  # the queue's own handler
    assert message.headers["fired_by"] == "billing" and "fired_as" not in message.headers
    assert not any(key.startswith(("x-", "archive_")) for key in message.headers)


def test_an_entry_dead_lettered_from_a_shared_queue_keeps_its_claimed_event_for_the_receiver_to_judge():
    entry = dead_lettered({"task": "test.refund", "id": "e2", "archive_task": "test.refund"}, queue="orders.events")
    assert (entry.queue, entry.task, entry.event, entry.fired_by) == ("orders.events", "", "test.refund", "billing")
    message = replay_message(entry, events_exchange="events")
    assert message.headers["fired_by"] == "billing" and "for_handler" not in message.headers
    # Dead-lettered by another service's queue (a routing key that is not orders'): no queue to replay to.
    assert dead_lettered({"task": "a.b", "id": "e3"}, queue="billing:a.b").queue == ""


def test_a_replay_of_an_entry_no_handler_was_chosen_for_carries_the_event_it_was_fired_as():
    entry = archived(b"[[1], {}, null]", task="test.refund")  # fired as a.b (its routing key), no handler chosen
    message = replay_message(entry, events_exchange="events")
    assert (message.headers["fired_as"], message.headers["task"]) == ("a.b", "test.refund")


def test_an_entry_a_worker_wrote_is_believed_and_its_replay_goes_to_the_handler_chosen_for_it():
    delivered = Delivered(headers={"task": "a.b:second", "id": "e4", "fired_by": "billing"}, body=b"[[], {}, null]",
                          content_type="application/json", content_encoding="utf-8", exchange="events",
                          routing_key="a.b", queue="orders.events")  # fmt: skip
    failure = Failure.from_exception(Reason.MAX_RETRIES, ValueError("x"), attempts=2)
    copy = archived_message(delivered, failure, "orders", "orders.on_second", task="a.b:second")
    stored = StoredMessage(copy.headers, copy.body, copy.content_type, copy.content_encoding, "orders-u",
                           "orders.direct", "orders.archive")  # fmt: skip
    entry = ArchivedMessage.of(stored, Identity("orders", "orders-u"))
    assert (entry.task, entry.event, entry.fired_by, entry.dead_lettered) == ("a.b:second", "a.b", "billing", False)
    message = replay_message(entry, events_exchange="events")
    assert message.headers["for_handler"] == "a.b:second" and message.headers["fired_by"] == "billing"
    # An export keeps what this reading believed, so that an import believes no more.
    again = ArchivedMessage.from_json(json.loads(json.dumps(dead_lettered({"task": "a.b", "id": "e5"}).to_json())))
    assert (again.queue, again.fired_by, again.reason) == ("orders:a.b", "billing", Reason.EXPIRED)
