"""Event keys: declared on ``@app.event``, carried in the ``event_key`` header (``partitionkey`` as a
CloudEvent), described in the AsyncAPI document. Pure logic, no broker: messages are built, not sent."""

from __future__ import annotations

import dataclasses

import pytest
from kombu.message import Message

from amqp_events import events_app
from amqp_events.asyncapi.document import document
from amqp_events.core.router import read_in_place
from amqp_events.middleware.cloud_events import CloudEventsReader
from amqp_events.wire.message import EVENT_KEY, EventMetadata, event_key, json_body


@pytest.fixture
def app():
    return events_app("shop", broker_url="memory://")


@pytest.mark.parametrize(("given", "travels"), [("order-7", "order-7"), (42, "42"), ("k" * 255, "k" * 255)])
def test_a_key_travels_as_a_string(given, travels):
    assert event_key(given) == travels


@pytest.mark.parametrize("given", [None, "", "k" * 256, True, 4.2, {"id": 1}])
def test_anything_else_is_refused_before_publishing(given):
    with pytest.raises(ValueError, match="an event key must be"):
        event_key(given)


def test_a_declared_key_is_taken_from_the_argument_however_it_is_passed(app):
    @app.event("orders.order.placed", key="order_id")
    def placed(order_id: int, total: str = "0", region: str = "eu"):
        """Validates nothing."""

    assert placed.key_of((7,), {}) == 7
    assert placed.key_of((), {"total": "1", "order_id": 8}) == 8

    @app.event("orders.order.moved", key=lambda order_id, region: f"{region}/{order_id}")
    def moved(order_id: int, region: str):
        """Validates nothing."""

    assert moved.key_of((7,), {"region": "us"}) == "us/7"


def test_a_key_that_is_no_argument_or_field_is_refused_when_declared(app):
    with pytest.raises(ValueError, match="'order' is not an argument"):

        @app.event("orders.order.placed", key="order")
        def placed(order_id: int):
            """Validates nothing."""

    @dataclasses.dataclass
    class Placed:
        order_id: int

    with pytest.raises(ValueError, match="'order' is not a field"):
        app.event("orders.order.placed", key="order")(Placed)
    with pytest.raises(ValueError, match="key must be an argument's name or a callable"):
        app.event("orders.order.placed", key=3)


def test_the_key_is_in_the_message_in_either_wire_format_and_read_back_from_a_cloud_event(app):
    message = app.event_message("orders.order.placed", [7], {}, key=7)
    assert message.headers[EVENT_KEY] == "7"
    assert EventMetadata.from_headers(message.headers).key == "7"
    assert EVENT_KEY not in app.event_message("orders.order.placed", [7], {}).headers

    cloud_event = app.event_message("orders.order.placed", [], {"order_id": 7}, wire_format="cloudevents", key=7)
    assert cloud_event.headers["ce-partitionkey"] == "7"
    arrived = Message(
        body=json_body(cloud_event.body),
        headers=cloud_event.headers,
        content_type="application/json",
        content_encoding="utf-8",
    )
    assert read_in_place(arrived, lambda received: CloudEventsReader().before_receive(None, received)) is None
    assert arrived.headers[EVENT_KEY] == "7"  # read into the library's form


def test_the_asyncapi_document_names_a_declared_key(app):
    @app.event("orders.order.placed", key="order_id")
    def placed(order_id: int):
        """Validates nothing."""

    @app.event("orders.order.noted")
    def noted(text: str):
        """Validates nothing."""

    messages = document(app.context, app.declared_events, "amqp://localhost//")["components"]["messages"]
    placed_headers = messages["orders.order.placed"]["headers"]
    assert EVENT_KEY in placed_headers["required"]
    assert "the argument 'order_id'" in placed_headers["properties"][EVENT_KEY]["description"]
    assert "ce-partitionkey" in messages["orders.order.placed.cloudevent"]["headers"]["required"]
    assert EVENT_KEY not in messages["orders.order.noted"]["headers"]["required"]
