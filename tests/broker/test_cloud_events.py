"""CloudEvents on a real broker with real workers: accepted in every content mode, retried, archived and replayed;
fired so that the ``cloudevents`` SDK reads them; bad ones archived with their reason while the worker goes on.

The messages of foreign producers are written by the ``cloudevents`` SDK's own RabbitMQ and AMQP bindings.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

import pytest
from cloudevents.core.bindings import amqp, rabbitmq
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from helpers import wait_archived
from kombu import Connection, Exchange, Queue

from amqp_events import Reason, events_app
from amqp_events.testing import wait_for

TIME = datetime(2026, 11, 23, 9, 30, tzinfo=timezone.utc)


def cloud_event(type_="test.ping", data=None, **attributes):
    values = {"type": type_, "source": "urn:shop:web", "id": str(uuid.uuid4()), "time": TIME, **attributes}
    return CloudEvent({**values, "specversion": "1.0", "datacontenttype": "application/json"}, data)


def publish(broker_url, headers, body, content_type, routing_key="test.ping"):
    """Publish as a foreign producer would: raw bytes and headers to the events exchange."""
    with Connection(broker_url) as connection:
        connection.Producer().publish(
            body,
            exchange="events",
            routing_key=routing_key,
            headers=headers,
            content_type=content_type,
            content_encoding="utf-8",
            serializer=None,
        )


def written(event, mode):
    """``event`` as the SDK writes it in ``mode``: (headers, body, content type)."""
    if mode == "binary":
        message = rabbitmq.to_binary(event, JSONFormat())
        return message.headers, message.body, message.content_type
    if mode == "structured":
        message = rabbitmq.to_structured(event, JSONFormat())
        return message.headers, message.body, message.content_type
    message = amqp.to_binary(event, JSONFormat())  # the AMQP binding: cloudEvents_ headers, time in milliseconds
    return message.application_properties, message.application_data, message.properties["content-type"]


@pytest.mark.parametrize("mode", ["binary", "structured", "amqp-binding"])
def test_a_cloud_event_in_any_content_mode_reaches_the_handler_with_its_data(mode, worker, broker_url, records):
    worker("orders")
    event = cloud_event(data={"tag": f"ce-{mode}"})
    publish(broker_url, *written(event, mode))
    [run] = records.wait(1, tag=f"ce-{mode}")
    assert (run["event"], run["id"], run["fired_by"], run["attempt"]) == (
        "test.ping",
        event.get_id(),
        None,  # its source is its sender's say; no user_id, so nothing verifies an author
        1,
    )
    assert datetime.fromisoformat(run["fired_at"]) == TIME


def test_a_failing_cloud_event_is_retried_archived_with_its_attributes_and_replayed(
    worker, broker_url, records, archive_of, cli
):
    process = worker("orders")
    flaky = cloud_event(data={"tag": "flaky", "how": {"fail_times": 1}})
    doomed = cloud_event(data={"tag": "doomed", "how": {"permanent": True}}, subject="invoice-42")
    for event in (flaky, doomed):
        publish(broker_url, *written(event, "binary"))
    assert [run["attempt"] for run in records.wait(2, tag="flaky")] == [1, 2]  # retried through the delay ladder
    [archived] = wait_archived(archive_of("orders"), 1)
    assert (archived.id, archived.event, archived.reason) == (doomed.get_id(), "test.ping", Reason.NON_RETRYABLE)
    assert archived.cloud_event["source"] == "urn:shop:web" and archived.cloud_event["subject"] == "invoice-42"
    shown = cli("archive", "show", doomed.get_id()).output
    assert "cloudevent:" in shown and "subject:" in shown and "invoice-42" in shown
    process.stop()
    worker("orders", env={"FIXED": "1"})
    assert cli("archive", "replay", "--yes").exit_code == 0
    [_, replayed] = records.wait(2, tag="doomed")
    assert (replayed["id"], replayed["fired_by"], replayed["attempt"]) == (doomed.get_id(), None, 1)


@pytest.mark.parametrize(
    ("headers", "body", "content_type", "routing_key", "reason"),
    [
        ({"ce-specversion": "1.0", "ce-id": "no-type", "ce-source": "s"}, b'{"tag": "x"}', "application/json",
         "test.ping", Reason.INVALID_CLOUDEVENT),
        ({"ce-specversion": "1.0", "ce-id": "text", "ce-source": "s", "ce-type": "test.ping"}, b"x", "text/plain",
         "test.ping", Reason.FORBIDDEN_CONTENT_TYPE),
        ({"ce-specversion": "1.0", "ce-id": "broken", "ce-source": "s", "ce-type": "test.ping"}, b"{tag",
         "application/json", "test.ping", Reason.UNDECODABLE),
        # its type is not the event it was fired as: a sender cannot pick another handler with it
        ({"ce-specversion": "1.0", "ce-id": "unknown", "ce-source": "s", "ce-type": "no.such.event"},
         b'{"tag": "x"}', "application/json", "test.ping", Reason.MALFORMED_HEADERS),
        ({"ce-specversion": "0.3", "ce-id": "old", "ce-source": "s", "ce-type": "test.ping"}, b'{"tag": "x"}',
         "application/json", "test.ping", Reason.INVALID_CLOUDEVENT),
        ({"ce-specversion": "1.0", "ce-id": "misfit", "ce-source": "s", "ce-type": "test.ping"}, b'{"nonsense": 1}',
         "application/json", "test.ping", Reason.BAD_ARGUMENTS),
    ],
    ids=["no-type", "text-data", "broken-json", "type-not-as-fired", "specversion-0.3", "data-misfits-the-handler"],
)  # fmt: skip
def test_a_bad_cloud_event_is_archived_with_its_reason_and_the_worker_goes_on(
    headers, body, content_type, routing_key, reason, worker, producer, broker_url, records, archive_of
):
    process = worker("orders")
    publish(broker_url, headers, body, content_type, routing_key)
    [archived] = wait_archived(archive_of("orders"), 1)
    assert (archived.reason, archived.id, archived.queue) == (reason, headers["ce-id"], "orders:test.ping")
    assert archived.cloud_event["id"] == headers["ce-id"] and archived.exception_message
    wait_for(lambda: f"reason={reason}" in process.log(), 10, what="the archiving logged")
    producer.fire("test.ping", ["still serving"], {})
    records.wait(1, tag="still serving")
    assert process.is_running()


def test_events_fired_as_cloud_events_are_read_by_the_sdk_and_handled_beside_celery_messages(
    worker, broker_url, records
):
    worker("orders")
    app = events_app("web", broker_url=broker_url, amqp_events_wire_format="cloudevents")
    celery_format = events_app("legacy", broker_url=broker_url)
    exchange = Exchange("events", "topic", passive=True)
    with Connection(broker_url) as connection:
        queue = Queue(
            f"sdk-{uuid.uuid4().hex}", exchange, "test.ping", exclusive=True, channel=connection.default_channel
        )
        queue.declare()
        try:
            event_id = app.fire("test.ping", kwargs={"tag": "as-cloudevent"})
            legacy_id = celery_format.fire("test.ping", ["as-celery"])
            message = wait_for(lambda: queue.get(no_ack=True), 10, what="the fired CloudEvent")
        finally:
            app.close()
            celery_format.close()
    body = message.body if isinstance(message.body, bytes) else message.body.encode()
    read = rabbitmq.from_binary(
        rabbitmq.RabbitMQMessage(message.headers, message.content_type, body), JSONFormat(), CloudEvent
    )
    assert (read.get_type(), read.get_id(), read.get_source()) == ("test.ping", event_id, "web")
    assert read.get_data() == {"tag": "as-cloudevent"} and read.get_time() is not None
    assert "task" not in message.headers and message.content_type == "application/json"
    runs = {run["tag"]: run for run in records.wait(2)}
    # The test's apps share one RabbitMQ user: nothing tells them apart, so no author is verified.
    assert (runs["as-cloudevent"]["id"], runs["as-cloudevent"]["fired_by"]) == (event_id, None)
    assert (runs["as-celery"]["id"], runs["as-celery"]["fired_by"]) == (legacy_id, None)
    assert json.loads(body) == {"tag": "as-cloudevent"}
