"""The router over whole message spaces (no broker): whatever a sender writes in the headers and the body, and
whichever queue the message is taken from, :func:`~amqp_events.core.router.route` returns one route, and what runs
is decided by the queue and the event the broker routed, never by a header a sender wrote."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.message import Message

from amqp_events import Reason, events_app
from amqp_events.core.router import Copies, Defer, ToArchive, ToHandler, route
from amqp_events.topology.names import slot_of
from amqp_events.wire.message import FIRED_AS, FIRED_BY, FOR_HANDLER
from amqp_events.wire.trust import OWN_COPIES_ONLY

app = events_app("orders", broker_url="amqp://guest:guest@127.0.0.1:1//")


@app.handler("billing.invoice.paid")
def on_paid(invoice_id: int, amount: str) -> None: ...


@app.handler("billing.invoice.paid", name="audit")
def audit(invoice_id: int, amount: str) -> None: ...


@app.handler("shipping.parcel.sent")
def on_sent(parcel_id: int) -> None: ...


EVENTS = ["billing.invoice.paid", "shipping.parcel.sent", "billing.refund.made", ""]
TASKS = [*EVENTS, "billing.invoice.paid:audit", "shipping.parcel.sent:audit", "celery.ping"]
OWN_QUEUES = ["orders:billing.invoice.paid", "orders:billing.invoice.paid:audit", "orders:shipping.parcel.sent"]
QUEUES = [*OWN_QUEUES, "billing:billing.invoice.paid", "orders.archive", ""]
USERS = ["billing", "shipping", "guest", "", None]

#: What a sender may claim in a well-formed header: a handler, an author, the event it was fired as, a key.
CLAIMS = [FOR_HANDLER, FIRED_BY, FIRED_AS, "event_key", "argsrepr", "fired_at"]
names = st.sampled_from(
    ["task", "id", FOR_HANDLER, FIRED_BY, FIRED_AS, "retries", "eta", "x-death", "event_key", "argsrepr",
     *OWN_COPIES_ONLY]
) | st.text(max_size=12)  # fmt: skip
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
values = st.recursive(
    scalars | st.sampled_from(TASKS),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
bodies = st.one_of(
    st.just(json.dumps([[42, "10.00"], {}, {}])),
    st.builds(lambda args: json.dumps([args, {}, {}]), st.lists(st.integers() | st.text(max_size=5), max_size=3)),
    st.binary(max_size=64),
)


@st.composite
def messages(draw: st.DrawFn) -> tuple[Message, str, str]:
    event = draw(st.sampled_from(EVENTS))
    task = draw(st.just(event) | st.sampled_from(TASKS))  # as fired, or another event's (a lie)
    headers: dict[Any, Any] = {"task": task, "id": draw(st.text(min_size=1, max_size=8))}
    forged = st.dictionaries(st.sampled_from(CLAIMS), st.sampled_from(TASKS) | st.text(max_size=8), max_size=3)
    headers.update(draw(forged | st.dictionaries(names, values, max_size=6)))  # well-formed lies, or anything
    exchange = draw(st.sampled_from(["events", "orders.direct", "orders.dead-letter", ""]))
    its_queues = [queue for queue in OWN_QUEUES if event and queue.startswith(f"orders:{event}")]
    queue = draw(st.sampled_from(its_queues or QUEUES) | st.sampled_from(QUEUES))  # the event's, or any
    user = draw(st.sampled_from(USERS))
    message = Message(
        body=draw(bodies),
        headers=headers,
        content_type=draw(st.sampled_from(["application/json"] * 3 + ["application/x-python-serialize", None, "t/x"])),
        content_encoding="utf-8",
        delivery_info={"exchange": exchange, "routing_key": event, "redelivered": draw(st.booleans())},
        properties={} if user is None else {"user_id": user},
        channel=None,
    )
    return message, queue, exchange


@contextmanager
def unforeseen() -> Iterator[list[logging.LogRecord]]:
    """What the router's catch-all logs meanwhile (a message nobody foresaw, archived as undecodable)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("amqp_events.core.router")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


@settings(max_examples=600)
@given(messages())
def test_any_message_gets_one_route_and_what_runs_is_the_queue_s_handler_for_the_routed_event(drawn):
    message, queue, exchange = drawn
    named = message.headers.get(FOR_HANDLER)
    with unforeseen() as failures:
        routed = route(app.context, message, queue)
    assert not failures  # every refusal has its reason: none reached the router's catch-all
    assert isinstance(routed, ToArchive | Copies | Defer | ToHandler)
    if isinstance(routed, ToArchive):
        assert isinstance(routed.reason, Reason) and isinstance(routed.error, Exception)
    if isinstance(routed, ToHandler):
        # The queue decides, whatever the headers name; only a copy the service's own user sent may name its
        # handler (a retry crossing a layout move arrives in one of the new layout's queues: topology/moving.py).
        if not (message.properties.get("user_id") == "guest" and routed.handler.task_name == named):
            assert routed.handler.queue == queue
        if exchange == "events":  # fired: the event is the one the broker routed
            assert routed.handler.event == message.delivery_info["routing_key"]


@settings(max_examples=300)
@given(messages())
def test_the_author_a_handler_sees_is_the_one_the_broker_verified(drawn):
    message, queue, _ = drawn
    user = message.properties.get("user_id")
    route(app.context, message, queue)
    if isinstance(message.headers, dict) and user != "guest":  # guest: the service's own user, its own copies
        assert message.headers.get(FIRED_BY, "") in ("", user)
        assert not set(OWN_COPIES_ONLY) & set(message.headers)


def test_a_well_formed_event_runs_its_queue_s_handler():
    body = json.dumps([[42, "10.00"], {}, {}])
    for queue, name in [(OWN_QUEUES[0], "on_paid"), (OWN_QUEUES[1], "audit")]:
        message = Message(body=body, headers={"task": "billing.invoice.paid", "id": "e1"},
                          content_type="application/json", content_encoding="utf-8",
                          delivery_info={"exchange": "events", "routing_key": "billing.invoice.paid"},
                          properties={"user_id": "billing"}, channel=None)  # fmt: skip
        routed = route(app.context, message, queue)
        assert isinstance(routed, ToHandler) and routed.handler.name.endswith(name)
        assert message.headers[FIRED_BY] == "billing"


ledger = events_app("ledger", broker_url="amqp://guest:guest@127.0.0.1:1//")


@ledger.handler("accounts.money.moved", ordered_by="account")
def on_moved(account: Any, cents: int) -> None: ...


def taken(queue: str, args: list[Any], **headers: Any) -> tuple[Message, Any]:
    body = json.dumps([args, {}, {}]).encode()
    message = Message(body=body, headers={"task": "accounts.money.moved", "id": "e1", **headers},
                      content_type="application/json", content_encoding="utf-8",
                      delivery_info={"exchange": "ledger.ordered", "routing_key": "accounts.money.moved"},
                      properties={"user_id": "accounts"}, channel=None)  # fmt: skip
    return message, route(ledger.context, message, queue)


@given(st.text(min_size=1, max_size=40) | st.integers(), st.sampled_from([None, "event_key"]))
def test_an_ordered_event_without_its_slot_is_sent_to_its_key_s_partition_as_it_arrived(key, given_as):
    args, headers = ([key, 5], {}) if given_as is None else ([None, 5], {"event_key": str(key)})
    message, routed = taken("ledger.ordered.intake", args, **headers)
    assert isinstance(routed, Copies) and len(routed.messages) == 1
    [copy] = routed.messages
    assert (copy.exchange, copy.routing_key) == ("ledger.ordered", "accounts.money.moved")
    assert copy.headers["event_key"] == str(key) and copy.headers["event_slot"] == slot_of(str(key))
    assert copy.body == message.body and copy.content_type == "application/json"  # only its headers change


@given(st.none() | st.floats() | st.lists(st.integers(), max_size=2) | st.just(""))
def test_an_ordered_event_whose_arguments_give_no_key_is_archived_for_its_handler(key):
    _, routed = taken("ledger.ordered.intake", [key, 5])
    assert isinstance(routed, ToArchive) and routed.reason == Reason.BAD_ARGUMENTS
    assert routed.handler is not None and routed.handler.function.__name__ == "on_moved"


def test_an_ordered_event_in_its_partition_runs_in_its_key_s_lane():
    _, routed = taken("ledger.ordered.01", ["a-1", 5], event_key="a-1", event_slot=slot_of("a-1"))
    assert isinstance(routed, ToHandler) and routed.handler.function.__name__ == "on_moved"
