"""Messages a worker cannot run are archived with a reason; the worker keeps serving (real broker)."""

from __future__ import annotations

import pickle

import pytest
from helpers import wait_archived
from kombu import Connection

from amqp_events import Reason
from amqp_events.errors import TopologyMissing
from amqp_events.testing import wait_for

VALID_HEADERS = {"task": "test.ping", "id": "bad-1", "lang": "py", "retries": 0}


def publish_raw(broker_url, body, routing_key="test.ping", headers=None, content_type="application/json"):
    with Connection(broker_url) as connection:
        producer = connection.Producer()
        producer.publish(
            body,
            exchange="events",
            routing_key=routing_key,
            headers=VALID_HEADERS if headers is None else headers,
            content_type=content_type,
            content_encoding="utf-8" if content_type == "application/json" else "binary",
            serializer=None,
        )


@pytest.mark.parametrize(
    ("body", "headers", "content_type", "reason"),
    [
        (b"{not json", None, "application/json", Reason.UNDECODABLE),
        (b'"a string, not [args, kwargs, embed]"', None, "application/json", Reason.UNDECODABLE),
        (b"[[], {}, {}]", {"id": "no-task-header"}, "application/json", Reason.UNDECODABLE),
        (pickle.dumps(([], {}, {})), None, "application/x-python-serialize", Reason.FORBIDDEN_CONTENT_TYPE),
        (b"[" * 100_000 + b"]" * 100_000, None, "application/json", Reason.UNDECODABLE),
    ],
    ids=["garbage", "wrong-shape", "no-task-header", "pickle", "deeply-nested"],
)
def test_a_message_that_cannot_be_decoded_is_archived_and_the_worker_goes_on(
    body, headers, content_type, reason, worker, producer, broker_url, records, archive_of
):
    process = worker("orders")
    publish_raw(broker_url, body, headers=headers, content_type=content_type)
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.reason == reason
    assert archived.body == body and archived.content_type == content_type  # kept byte for byte
    assert archived.queue == "orders:test.ping"
    # (handler=-, or the handler its queue and event chose, when its body was read before it was found wrong)
    wait_for(lambda: f" reason={reason}" in process.log(), 10, what="the archiving logged")
    producer.fire("test.ping", ["still serving"], {})
    records.wait(1)
    assert process.is_running()


def test_an_event_this_service_has_no_handler_for_is_archived_not_looped(worker, producer, broker_url, archive_of):
    process = worker("orders")
    with Connection(broker_url) as connection:  # a message in orders' queue for an unknown event
        connection.Producer().publish(
            [[], {}, {}],
            exchange="",
            routing_key="orders:test.ping",
            headers={**VALID_HEADERS, "task": "no.such.event"},
            serializer="json",
        )
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.reason == Reason.UNKNOWN_EVENT and archived.event == "no.such.event"
    assert "no handler for event 'no.such.event'" in archived.exception_message
    wait_for(lambda: "handler=- reason=unknown_event" in process.log(), 5)


def test_arguments_that_do_not_fit_the_handler_are_archived(worker, producer, records, archive_of):
    worker("orders")
    event_id = producer.fire("billing.invoice.paid", [1], {"currency": "EUR"})
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.id == event_id and archived.reason == Reason.BAD_ARGUMENTS and archived.attempts == 1  # as logged
    assert "on_invoice_paid(invoice_id: int, amount: str)" in archived.exception_message
    assert archived.payload[:2] == [[1], {"currency": "EUR"}]
    assert records.all() == []


def test_a_typed_event_that_does_not_validate_is_archived(worker, producer, archive_of):
    worker("orders")
    producer.fire("users.registered_model", [], {"user_id": "not-a-uuid", "email": "x"})
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.reason == Reason.BAD_ARGUMENTS and "UserRegisteredModel" in archived.exception_message


def archived_or_none(archive):
    """The archive's messages; ``None`` while the queue does not exist (the worker declares it again)."""
    try:
        return archive.list()
    except TopologyMissing:
        return None


def test_a_message_whose_archiving_fails_is_retried_then_returned_to_its_queue_never_held(
    worker, producer, broker_url, records, archive_of
):
    process = worker("orders", env={"PUBLISH_TIMEOUT": "1"})
    with Connection(broker_url) as connection:  # an archive that refuses everything: publishes are nacked
        channel = connection.default_channel
        channel.queue_delete("orders.archive")
        refuse_all = {"x-max-length": 0, "x-overflow": "reject-publish"}
        channel.queue_declare("orders.archive", durable=True, auto_delete=False, arguments=refuse_all)
    publish_raw(broker_url, b"{not json")
    wait_for(lambda: "trying again in 1s" in process.log(), 15, what="a first retry of the archiving")
    wait_for(lambda: "returning it to its queue" in process.log(), 30, what="the message returned to its queue")
    with Connection(broker_url) as connection:  # the fix: the worker declares the archive again when it finds none
        connection.default_channel.queue_delete("orders.archive")
    wait_for(lambda: "reason=undecodable" in process.log(), 30, what="the message archived at last")
    [archived] = wait_for(lambda: archived_or_none(archive_of("orders")), 30, what="the archive declared again")
    assert archived.reason == Reason.UNDECODABLE and archived.body == b"{not json"
    producer.fire("test.ping", ["still serving"], {})
    records.wait(1)
    assert process.is_running()


@pytest.mark.parametrize(
    ("body", "headers", "reason"),
    [
        (b"{not json", {"task": "accounts.money.moved", "id": "bad-2", "event_key": "a-1"}, Reason.UNDECODABLE),
        (b"[[], {}, {}]", {"task": "no.such.event", "id": "bad-3", "event_key": "a-1"}, Reason.UNKNOWN_EVENT),
        (b'[[], {"seq": 1}, {}]', {"task": "accounts.money.moved", "id": "bad-4"}, Reason.BAD_ARGUMENTS),  # no key
    ],
    ids=["garbage", "unknown-event", "no-key"],
)
def test_a_bad_message_in_a_partition_of_ordered_handlers_is_archived_and_the_key_goes_on(
    body, headers, reason, worker, producer, broker_url, records, archive_of
):
    process = worker("ledger", env={"PARTITIONS": "1"})
    with Connection(broker_url) as connection:  # straight into the partition, past every check of a producer
        connection.Producer().publish(
            body,
            exchange="",
            routing_key="ledger.ordered.00",
            headers=headers,
            content_type="application/json",
            content_encoding="utf-8",
            serializer=None,
        )
    [archived] = wait_archived(archive_of("ledger"), 1)
    assert archived.reason == reason and archived.body == body
    producer.fire("accounts.money.moved", kwargs={"account": "a-1", "seq": 2}, key="a-1")
    records.wait(1)
    assert process.is_running()
