"""CloudEvents read and written, payload schemas and the AsyncAPI document: pure logic, no broker.

Messages are written and read with the ``cloudevents`` SDK's own RabbitMQ and AMQP bindings, not by hand.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from datetime import datetime, timedelta, timezone
from typing import Literal
from unittest.mock import patch

import pytest
from cloudevents.core.bindings import amqp, rabbitmq
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.message import Message

from amqp_events import Reason, events_app
from amqp_events.asyncapi.document import document
from amqp_events.asyncapi.schemas import payload_schema
from amqp_events.core.arguments import Arguments
from amqp_events.core.router import read_in_place
from amqp_events.errors import Refused as Unreadable
from amqp_events.middleware.cloud_events import CloudEventsReader
from amqp_events.wire import cloud_events
from amqp_events.wire.cloud_events import CLOUDEVENT, PREFIXES, attributes_of, is_cloud_event, read
from amqp_events.wire.message import JSON

TIME = datetime(2026, 11, 23, 9, 30, tzinfo=timezone.utc)


def adopt(message: Message) -> Unreadable | None:
    """A worker's reading of a message as it arrived, with the CloudEvents middleware."""
    return read_in_place(message, lambda received: CloudEventsReader().before_receive(None, received))


ATTRIBUTES = {"type": "billing.invoice.paid", "source": "/billing", "id": "inv-42", "time": TIME}
DATA = {"invoice_id": 42, "amount": "10.00"}


def sdk_event(data=DATA, **attributes):
    return CloudEvent({**ATTRIBUTES, **attributes, "specversion": "1.0"}, data)


def binary(event=None):
    written = rabbitmq.to_binary(event or sdk_event(datacontenttype=JSON), JSONFormat())
    return written.headers, written.body, written.content_type


def test_binary_mode_maps_every_attribute():
    headers, body, content_type = binary()
    read_event = read(headers, body, content_type)
    assert read_event.kwargs == DATA
    assert read_event.headers["task"] == "billing.invoice.paid"
    assert read_event.headers["id"] == "inv-42"
    assert read_event.headers["fired_by"] == "/billing"
    assert datetime.fromisoformat(read_event.headers["fired_at"]) == TIME
    assert read_event.headers[CLOUDEVENT]["source"] == "/billing"


def test_structured_mode_is_read_like_binary_mode():
    written = rabbitmq.to_structured(sdk_event(datacontenttype=JSON), JSONFormat())
    assert written.content_type == "application/cloudevents+json"
    read_event = read(written.headers, written.body, written.content_type)
    assert (read_event.kwargs, read_event.headers["id"], read_event.headers["task"]) == (
        DATA,
        "inv-42",
        "billing.invoice.paid",
    )


def test_the_amqp_bindings_prefixes_are_read_too():
    written = amqp.to_binary(sdk_event(datacontenttype=JSON), JSONFormat())
    headers = dict(written.application_properties)  # cloudEvents_type, ...; time as epoch milliseconds
    assert all(key.startswith("cloudEvents_") for key in headers)
    read_event = read(headers, written.application_data, written.properties["content-type"])
    assert (read_event.kwargs, read_event.headers["task"]) == (DATA, "billing.invoice.paid")
    assert datetime.fromisoformat(read_event.headers["fired_at"]) == TIME
    colon = {key.replace("cloudEvents_", "cloudEvents:"): value for key, value in headers.items()}
    assert read(colon, written.application_data, JSON).headers["id"] == "inv-42"


@pytest.mark.parametrize(
    ("headers", "body", "content_type", "reason", "says"),
    [
        ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s"}, b"{}", JSON, "invalid_cloudevent", "'type'"),
        ({"ce-specversion": "0.3", "ce-id": "1", "ce-source": "s", "ce-type": "t"}, b"{}", JSON, "invalid_cloudevent",
         "'0.3' is not supported"),
        ({"ce-specversion": "1.0", "ce-id": "x" * 65, "ce-source": "s", "ce-type": "t"}, b"{}", JSON,
         "invalid_cloudevent", "65 characters"),
        ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "t", "ce-time": "yesterday"}, b"{}",
         JSON, "invalid_cloudevent", "not a valid CloudEvent"),
        ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "t"}, b"hello", "text/plain",
         "forbidden_content_type", "'text/plain'"),
        ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "t"}, b"{not json", JSON,
         "undecodable", "not valid JSON"),
        ({"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "t"}, b"[1, 2]", JSON,
         "bad_arguments", "JSON object"),
        ({}, b'{"specversion": "1.0", "id": "1", "source": "s", "type": "t", "data_base64": "AAE="}',
         "application/cloudevents+json", "forbidden_content_type", "binary"),
        ({}, b'{"specversion": "1.0", "id": "1", "source": "s"}', "application/cloudevents+json",
         "invalid_cloudevent", "'type'"),
        ({}, b"[]", "application/cloudevents-batch+json", "forbidden_content_type", "batch"),
    ],
    ids=["no-type", "specversion-0.3", "long-id", "bad-time", "text-data", "broken-json", "array-data",
         "base64-data", "structured-no-type", "batch"],
)  # fmt: skip
def test_a_cloud_event_that_cannot_be_read_says_why(headers, body, content_type, reason, says):
    with pytest.raises(Unreadable) as raised:
        read(headers, body, content_type)
    assert (raised.value.reason, says in str(raised.value)) == (reason, True), str(raised.value)


def test_without_the_extra_a_cloud_event_is_refused_with_the_install_line_and_other_messages_pass():
    def missing():
        raise ImportError("No module named 'cloudevents'")

    event = {"ce-specversion": "1.0", "ce-id": "e1", "ce-source": "/s", "ce-type": "t"}
    with patch.object(cloud_events, "_sdk", missing):
        for reading in (read, cloud_events.as_event_message):
            with pytest.raises(Unreadable, match=r"celery-amqp-events\[cloudevents\]") as refused:
                reading(event, b"{}", JSON)
            assert refused.value.reason is Reason.UNDECODABLE
        assert cloud_events.as_event_message({"id": "no-task-header"}, b"[]", JSON) is None


def test_only_messages_without_a_task_header_are_read_as_cloud_events():
    assert is_cloud_event({"ce-type": "t"}, JSON)
    assert is_cloud_event({}, "application/cloudevents+json; charset=utf-8")
    assert not is_cloud_event({"task": "t", "ce-type": "t"}, JSON)  # the library's own message
    assert not is_cloud_event({"id": "1"}, JSON)


def test_adopting_rewrites_the_message_in_place_and_keeps_its_other_headers():
    headers, body, content_type = binary(
        sdk_event(datacontenttype=JSON, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    )
    message = Message(body=body, content_type=content_type, headers={**headers, "x-custom": "kept"})
    assert adopt(message) is None
    assert message.headers["task"] == "billing.invoice.paid" and message.headers["x-custom"] == "kept"
    assert not [key for key in message.headers if key.startswith("ce-")]
    assert message.headers["traceparent"].startswith("00-111")  # the tracing extension, as W3C context
    assert json.loads(message.body) == [[], DATA, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    assert adopt(message) is None and message.headers["task"] == "billing.invoice.paid"  # read once only


def test_an_unreadable_cloud_event_is_left_as_it_arrived():
    message = Message(body=b"{}", content_type=JSON, headers={"ce-id": "1"})
    refused = adopt(message)
    assert refused is not None and refused.reason == Reason.INVALID_CLOUDEVENT
    assert (message.headers, message.body) == ({"ce-id": "1"}, b"{}")


def test_the_attributes_of_a_message_are_shown_however_it_arrived():
    headers, body, content_type = binary()
    assert attributes_of(headers, body, content_type)["type"] == "billing.invoice.paid"
    structured = rabbitmq.to_structured(sdk_event(), JSONFormat())
    assert attributes_of({}, structured.body, structured.content_type)["id"] == "inv-42"
    assert attributes_of({CLOUDEVENT: {"id": "kept"}, "task": "t"}, b"[]", JSON) == {"id": "kept"}
    assert attributes_of({"task": "t", "id": "1"}, b"[]", JSON) == {}


def test_an_app_fires_binary_mode_that_the_sdk_reads():
    app = events_app("billing", broker_url="memory://", amqp_events_wire_format="cloudevents")

    @app.event("billing.invoice.paid")
    def invoice_paid(invoice_id: int, amount: str) -> None:
        pass

    message = app.event_message("billing.invoice.paid", [], {"invoice_id": 42, "amount": "10.00"})
    body = json.dumps(message.body).encode()
    event = rabbitmq.from_binary(rabbitmq.RabbitMQMessage(message.headers, JSON, body), JSONFormat(), CloudEvent)
    assert (event.get_type(), event.get_source(), event.get_id()) == (
        "billing.invoice.paid",
        "billing",
        message.message_id,
    )
    assert event.get_data() == DATA and event.get_time() is not None
    with pytest.raises(ValueError, match="keyword arguments"):
        app.fire("billing.invoice.paid", [42, "10.00"])


def test_positional_arguments_travel_by_name():
    def invoice_paid(invoice_id: int, amount: str = "0", *rest: int, **extra: str) -> None:
        pass

    arguments = Arguments(inspect.signature(invoice_paid))
    assert arguments.by_name((42,), {"note": "x"}) == {"invoice_id": 42, "note": "x"}
    assert arguments.by_name((42, "1", 3), {}) is None  # *rest's values have no names


@dataclasses.dataclass
class Line:
    sku: str
    quantity: int = 1


@dataclasses.dataclass
class Shipped:
    order_id: int
    lines: list[Line]
    carrier: Literal["dhl", "ups"] | None = None


def test_payload_schemas_come_from_signatures_and_dataclasses():
    def placed(order_id: int, total: float, tags: list[str], note: str | None = None, **extra: object) -> None:
        pass

    schema = payload_schema(placed)
    assert schema["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert schema["properties"]["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert schema["required"] == ["order_id", "total", "tags"] and "additionalProperties" not in schema
    definitions: dict = {}
    shipped = payload_schema(Shipped, definitions=definitions)
    assert shipped["properties"]["lines"] == {"type": "array", "items": {"$ref": "#/components/schemas/Line"}}
    assert shipped["properties"]["carrier"]["anyOf"][0] == {"enum": ["dhl", "ups"]}
    assert definitions["Line"]["required"] == ["sku"] and shipped["additionalProperties"] is False


def test_the_asyncapi_document_sends_what_the_service_fires_and_receives_what_it_handles():
    app = events_app("orders", broker_url="amqp://user:secret@rabbit.example:5673/shop")

    @app.event("orders.placed", wire_format="cloudevents")
    def placed(order_id: int) -> None:
        pass

    @app.handler("billing.invoice.paid")
    def on_paid(invoice_id: int, amount: str) -> None:
        pass

    described = document(app.context, app.declared_events, app.conf.broker_url)
    assert described["asyncapi"] == "3.0.0"
    assert described["servers"]["rabbitmq"]["host"] == "rabbit.example:5673"
    assert "secret" not in json.dumps(described)  # the broker's password never leaves
    send, receive = (
        described["operations"]["fire.orders.placed"],
        described["operations"]["handle.billing.invoice.paid"],
    )
    assert (send["action"], send["messages"]) == (
        "send",
        [{"$ref": "#/channels/orders.placed/messages/orders.placed.cloudevent"}],
    )
    assert (receive["action"], receive["channel"]) == ("receive", {"$ref": "#/channels/orders:billing.invoice.paid"})
    queue = described["channels"]["orders:billing.invoice.paid"]["bindings"]["amqp"]["queue"]
    assert (queue["name"], queue["vhost"]) == ("orders:billing.invoice.paid", "shop")
    schemas = described["components"]["schemas"]
    assert schemas["billing.invoice.paid"]["required"] == ["invoice_id", "amount"]
    headers = described["components"]["messages"]["orders.placed.cloudevent"]["headers"]
    assert headers["properties"]["ce-type"] == {"const": "orders.placed"}


def test_a_typed_event_fired_as_a_cloud_event_reaches_its_handler_as_an_instance():
    from amqp_events.testing import in_process

    app = events_app("shipping", broker_url="amqp://in-process.invalid//", amqp_events_wire_format="cloudevents")
    ShippedEvent = app.event("orders.shipped")(Shipped)
    received = []

    @app.handler(ShippedEvent)
    def on_shipped(event: Shipped) -> None:
        received.append(event)

    with in_process(app) as events:
        event_id = ShippedEvent(order_id=7, lines=[Line("sku-1", 2)], carrier="dhl").fire()
        [fired] = events.fired
    assert fired.kwargs == {"order_id": 7, "lines": [{"sku": "sku-1", "quantity": 2}], "carrier": "dhl"}
    [shipped] = received
    assert (type(shipped).__name__, shipped.order_id, shipped.carrier, fired.id) == ("Shipped", 7, "dhl", event_id)


NAMES = ("specversion", "id", "source", "type", "time", "subject", "partitionkey", "traceparent", "datacontenttype",
         "dataschema", "data", "Type", "x_y", "comexampleext")  # fmt: skip
TIMES = st.one_of(
    st.datetimes(timezones=st.sampled_from([timezone.utc, timezone(timedelta(hours=5, minutes=30))])).map(
        lambda moment: moment.isoformat().replace("+00:00", "Z")
    ),
    st.from_regex(r"\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,7})?(Z|[+-]\d\d:\d\d)?\Z"),
    st.text(max_size=12),
)
VALUES = st.one_of(st.text(max_size=8), st.sampled_from(["1.0", "0.3"]), TIMES, st.integers(), st.binary(max_size=4))
BODIES = st.one_of(
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3).map(
        lambda data: json.dumps(data).encode()
    ),
    st.sampled_from([b"", b"[1]", b'"text"', b"{not json", b"\xff\xfe", b' {"a": 1} ', b'{"a": 1} {"b": 2}']),
)
CE_HEADERS = st.dictionaries(
    st.tuples(st.sampled_from(PREFIXES), st.sampled_from(NAMES)).map("".join), VALUES, max_size=9
).map(lambda headers: {**headers, "ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "t"})


OTHER_HEADERS = st.dictionaries(st.sampled_from(["traceparent", "x-death", "origin", "x"]), VALUES, max_size=2)
CONTENT_TYPES = st.sampled_from(
    [JSON, None, "application/json; charset=utf-8", "text/json", "application/vnd.x+json", "Application/JSON",
     "text/plain", "application/cloudevents+json"]
)  # fmt: skip


def outcome(headers, body, content_type=JSON):
    try:
        event = read(headers, body, content_type)
        adopted = cloud_events.as_event_message(headers, body, content_type)
    except Unreadable as refused:
        return refused.reason
    assert adopted is not None
    return event.attributes, event.kwargs, json.loads(event.body), adopted[0], json.loads(adopted[1])


@settings(max_examples=400)
@given(st.one_of(CE_HEADERS, CE_HEADERS.map(lambda headers: {key: str(value) for key, value in headers.items()})),
       OTHER_HEADERS, BODIES, CONTENT_TYPES)  # fmt: skip
def test_binary_mode_is_read_as_the_sdk_reads_it(headers, others, body, content_type):
    """The common case is read without building the SDK's event: whatever comes, it reads what the SDK reads,
    and the message it becomes keeps the same other headers."""
    headers = {**others, **headers}
    with patch.object(cloud_events, "_read_plainly", lambda *_: None):
        by_the_sdk = outcome(headers, body, content_type)
    assert outcome(headers, body, content_type) == by_the_sdk
