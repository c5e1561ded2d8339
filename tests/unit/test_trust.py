"""What a receiver believes of a message (wire.trust), which service owns an event (topology.ownership), and which
handler runs it (core.addressing): decided by the receiver and what the broker verified, never by what a sender
wrote (no broker)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_events import Reason, events_app
from amqp_events.core.addressing import Unroutable, runnable
from amqp_events.core.addressing import address as route
from amqp_events.settings import Settings
from amqp_events.topology import delays
from amqp_events.topology.ownership import owned_regex, owner_of_event, topic_matches, topic_regex
from amqp_events.topology.permissions import service_grants
from amqp_events.wire.heartbeats import heartbeat, read_heartbeat
from amqp_events.wire.message import DEATH_HEADERS, FIRED_BY, FOR_HANDLER
from amqp_events.wire.trust import OWN_COPIES_ONLY, RECEIVER_DECIDES, Identity, drop_unverified, vouch

ORDERS = Identity("orders", "orders-user", {"orders-user": "orders", "billing-user": "billing"})
SHARED = Identity("orders", "guest")


# -- authors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("identity", "user_id", "claimed", "author"),
    [
        (ORDERS, "billing-user", "orders", "billing"),  # a sender's claim is never its author
        (ORDERS, "shipping", None, "shipping"),  # a user named after its service
        (ORDERS, None, "orders", None),  # nothing verified
        (ORDERS, "orders-user", "billing", "billing"),  # its own copy keeps the author it verified
        (ORDERS, "orders-user", None, "orders"),  # fired by the service itself, through a client that does not say
        (ORDERS, "orders-user", "", None),  # its own copy of an event with no verified author
        (SHARED, "guest", "billing", None),  # a shared user tells nobody apart
        (SHARED, "billing", "x", "billing"),
        (Identity("orders", None), "billing", "billing", None),  # its own user unknown (a certificate login)
    ],
)
def test_the_author_is_the_one_the_broker_verified(identity, user_id, claimed, author):
    assert identity.author(user_id, claimed) == author


header_values = st.one_of(st.none(), st.integers(), st.text(max_size=20), st.lists(st.integers(), max_size=3))
header_sets = st.dictionaries(
    st.sampled_from([*OWN_COPIES_ONLY, FIRED_BY, "task", "id", "retries", "event_key", "other"]), header_values
)


@given(header_sets, st.sampled_from(["billing-user", "shipping", "", None, 5]))
def test_a_sender_s_message_keeps_no_header_of_the_service_s_own_copies_and_its_author_is_verified(headers, user_id):
    vouched = dict(headers)
    assert vouch(ORDERS, user_id, vouched) is False
    assert not set(OWN_COPIES_ONLY) & set(vouched)
    assert vouched[FIRED_BY] == (ORDERS.service_of(user_id) if isinstance(user_id, str) and user_id else "")
    assert vouched.get("retries", 0) == 0
    assert vouched.get("event_key") != ""  # a history replay's gate is the service's alone


@given(header_sets)
def test_the_service_s_own_copy_is_kept_as_it_wrote_it(headers):
    vouched = dict(headers)
    assert vouch(ORDERS, "orders-user", vouched) is True
    assert {key: value for key, value in vouched.items() if key != FIRED_BY} == {
        key: value for key, value in headers.items() if key != FIRED_BY
    }


def test_a_user_the_service_trusts_sends_its_copies_too():
    console = Identity("orders", "orders-user", trusted=frozenset({"admin"}))
    assert console.sent_by_us("admin") and not console.sent_by_us("billing-user")


def test_a_heartbeat_is_believed_only_from_a_user_that_stands_for_its_service():
    beat = heartbeat("orders", "w1@host", "online", 1.0, {"on_refund": "open"}, {})
    assert read_heartbeat(beat, "orders-user", ORDERS)["breakers"] == {"on_refund": "open"}
    with pytest.raises(ValueError, match="does not stand for it"):
        read_heartbeat(beat, "billing-user", ORDERS)
    with pytest.raises(ValueError, match="does not stand for it"):
        read_heartbeat(beat, None, ORDERS)
    assert read_heartbeat(beat, "guest", SHARED)["worker"] == "w1@host"  # a shared user: nothing to check


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
)


@given(st.one_of(json_values, st.dictionaries(st.sampled_from(["service", "worker", "state", "time"]), json_values)))
def test_a_malformed_heartbeat_is_refused_with_a_reason_never_a_crash(body):
    try:
        beat = read_heartbeat(body, "guest", SHARED)
    except ValueError:
        return
    assert isinstance(beat["service"], str) and beat["state"] in ("online", "offline")


# -- ownership ----------------------------------------------------------------------------------------------

words = st.sampled_from(["billing", "orders", "user", "invoice", "paid", "created", "x"])
events = st.lists(words, min_size=1, max_size=4).map(".".join)
patterns = st.lists(st.one_of(words, st.sampled_from(["*", "#"])), min_size=1, max_size=4).map(".".join)
tables = st.dictionaries(patterns, st.sampled_from(["billing", "orders", "accounts"]), max_size=3)


@given(patterns, events)
def test_a_topic_pattern_as_a_regular_expression_matches_what_the_pattern_matches(pattern, event):
    assert bool(re.fullmatch(topic_regex(pattern), event)) is topic_matches(pattern, event)


@given(st.sampled_from(["billing", "orders", "accounts"]), tables, events)
def test_the_printed_topic_permission_lets_a_service_fire_exactly_the_events_it_owns(service, owners, event):
    assert bool(re.fullmatch(owned_regex(service, owners), event)) is (owner_of_event(event, owners) == service)


def test_an_event_belongs_to_its_first_word_unless_the_table_says_otherwise():
    owners = {"user.#": "accounts"}
    assert owner_of_event("billing.invoice.paid", owners) == "billing"
    assert owner_of_event("user.created", owners) == "accounts"


def test_with_ownership_the_permissions_keep_a_service_to_its_own_events_now_and_after_a_delay():
    grants = service_grants("billing", Settings(event_ownership=True))
    topics = {exchange: (write, read) for exchange, write, read in grants.topics}
    write_events, read_events = topics["events"]
    assert re.fullmatch(write_events, "billing.invoice.paid") and not re.fullmatch(write_events, "orders.refund")
    assert re.fullmatch(read_events, "orders.refund")  # it may subscribe to anything
    ladder = topics[delays.ENTRY_EXCHANGE][0]
    assert re.fullmatch(ladder, delays.routing_key(5, "event.billing.invoice.paid"))
    assert not re.fullmatch(ladder, delays.routing_key(5, "event.orders.refund"))
    assert re.fullmatch(ladder, delays.routing_key(5, "queue.billing:x.y"))
    assert "events" not in {exchange for exchange, _, _ in service_grants("billing", Settings()).topics}


# -- routing ------------------------------------------------------------------------------------------------


@pytest.fixture
def orders():
    app = events_app("orders", broker_url="amqp://orders-user:x@localhost//")

    @app.handler("billing.invoice.paid")
    def on_invoice_paid(invoice_id, amount): ...

    @app.handler("orders.refund")
    def on_refund(order_id, amount): ...

    @app.handler("user.created", name="welcome")
    def welcome(user_id): ...

    @app.handler("user.created", name="audit")
    def audit(user_id): ...

    return app


def headers_of(task, **more):
    return {"task": task, "id": "e-1", **more}


def test_a_sender_s_handler_header_cannot_pick_another_handler(orders):
    context = orders.context
    headers = headers_of("billing.invoice.paid", **{FOR_HANDLER: "orders.refund"})
    chosen = route(context, headers, "orders:billing.invoice.paid", "events", "billing.invoice.paid", own=False)
    assert chosen is orders.handlers["billing.invoice.paid"]


def test_a_copy_of_the_service_s_own_names_its_handler_but_only_one_of_its_event(orders):
    context = orders.context
    named = headers_of("user.created", **{FOR_HANDLER: "user.created:audit"})
    assert route(context, named, "orders:user.created:welcome", "orders.direct", "x", own=True).label == "audit"
    other = headers_of("billing.invoice.paid", **{FOR_HANDLER: "orders.refund"})
    chosen = route(context, other, "orders:billing.invoice.paid", "orders.direct", "x", own=True)
    assert chosen is orders.handlers["billing.invoice.paid"]


def test_a_task_header_of_another_event_than_it_was_fired_as_is_refused(orders):
    context = orders.context
    headers = headers_of("orders.refund")
    refused = route(context, headers, "orders:billing.invoice.paid", "events", "billing.invoice.paid", own=False)
    assert isinstance(refused, Unroutable) and refused.reason == Reason.MALFORMED_HEADERS
    delayed = delays.routing_key(3, "event.billing.invoice.paid")
    refused = route(context, headers, "orders:billing.invoice.paid", delays.DELIVERY_EXCHANGE, delayed, own=False)
    assert isinstance(refused, Unroutable) and "fired as 'billing.invoice.paid'" in str(refused.error)


def test_a_handler_is_chosen_by_the_queue_the_message_arrived_on(orders):
    context = orders.context
    refund = headers_of("orders.refund")  # sent straight into another handler's queue, as any user with access could
    refused = route(context, refund, "orders:billing.invoice.paid", "", "orders:billing.invoice.paid", own=False)
    assert isinstance(refused, Unroutable) and refused.reason == Reason.UNKNOWN_EVENT
    labelled = headers_of("user.created:audit")  # a label the sender wrote: the queue decides
    assert route(context, labelled, "orders:user.created:welcome", "events", "user.created", own=False).label == (
        "welcome"
    )
    assert isinstance(route(context, headers_of("orders.refund"), "", "", "", own=True), Unroutable)  # no queue


def test_celery_s_embed_is_never_followed():
    chain = {"chain": [{"task": "orders.refund", "args": [501], "kwargs": {"amount": 99999}}]}
    for embed in (chain, {"callbacks": [{"task": "x"}]}, {"errbacks": [1]}, {"chord": {"task": "y"}}):
        refused = runnable([[1], {}, embed])
        assert refused is not None and refused.reason == Reason.EMBEDDED_WORKFLOW
    assert runnable([[1], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]) is None
    assert runnable([[1], {}, None]) is None


def test_a_queue_cancelled_since_a_message_was_delivered_is_still_known_by_its_tag():
    from types import SimpleNamespace

    from amqp_events.celery.tags import ConsumedQueues

    consumer = SimpleNamespace(_active_tags={"orders:a": "1", "orders:b": "2"})
    queues = ConsumedQueues()
    assert queues.of(consumer, "1") == "orders:a"
    del consumer._active_tags["orders:b"]  # paused before its message was read
    consumer._active_tags["orders:b"] = "3"  # and resumed under a new tag
    assert (queues.of(consumer, "2"), queues.of(consumer, "3")) == ("orders:b", "orders:b")
    assert queues.of(consumer, "9") is None  # never seen: not guessed
    again = SimpleNamespace(_active_tags={"orders:b": "1"})  # a new connection numbers its tags afresh
    assert queues.of(again, "1") == "orders:b"
    with pytest.raises(LookupError):
        queues.of(SimpleNamespace(), "1")


# -- headers only the receiver or the broker writes -------------------------------------------------------------

steering = st.dictionaries(
    st.sampled_from([*RECEIVER_DECIDES, *DEATH_HEADERS, "task", "id", "eta", "expires", "root_id", "origin"]),
    st.one_of(st.none(), st.text(max_size=8), st.integers(), st.lists(st.integers(), max_size=2)),
)


@given(steering, st.booleans())
def test_what_the_receiver_decides_is_removed_and_the_broker_s_deaths_are_kept_only_off_its_dead_lettering(
    headers, dead_lettered
):
    kept = dict(headers)
    drop_unverified(kept, dead_lettered)
    assert not set(kept) & set(RECEIVER_DECIDES)  # a sender's time limits, task name, stamps, argsrepr: gone
    assert bool(set(kept) & set(DEATH_HEADERS)) == (dead_lettered and bool(set(headers) & set(DEATH_HEADERS)))
    assert {k: v for k, v in kept.items() if k not in DEATH_HEADERS} == {
        k: v for k, v in headers.items() if k not in RECEIVER_DECIDES and k not in DEATH_HEADERS
    }  # the sender's own: eta, expires, its ids
