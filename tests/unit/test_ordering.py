"""Ordered handling, the pure parts: lanes, keys from arguments, the partitions' topology. No broker."""

from __future__ import annotations

import dataclasses
import threading
import time
import zlib

import pytest
from kombu import Queue

from amqp_events import events_app
from amqp_events.asyncapi.document import document
from amqp_events.errors import BadArguments
from amqp_events.ordering.lanes import Lanes
from amqp_events.ordering.sequences import Action, Sequence, decide
from amqp_events.ordering.timers import Timers
from amqp_events.topology import partition_queue_name
from amqp_events.topology.layout import Binding
from amqp_events.topology.names import is_ordered_exchange, queue_kind, slot_of
from amqp_events.wire.message import copy_headers
from amqp_events.wire.parked import PARKS_KEY, RELEASE_PARKED, RELEASED_BEHIND, RELEASED_LAST


def test_a_key_s_items_run_one_at_a_time_in_order_and_other_keys_alongside():
    lanes: Lanes[str] = Lanes()
    assert lanes.offer("a", "a1") is True
    assert lanes.offer("a", "a2") is False
    assert lanes.offer("b", "b1") is True  # another key is not held up
    assert lanes.offer("a", "a3") is False
    assert (len(lanes), lanes.waiting()) == (2, 2)
    assert lanes.finish("a") == "a2"
    assert lanes.finish("b") is None
    assert lanes.finish("a") == "a3"
    assert lanes.finish("a") is None
    assert (len(lanes), lanes.waiting()) == (0, 0)
    assert lanes.offer("a", "a4") is True  # a key with nothing left starts over


@pytest.fixture
def app():
    return events_app("ledger", broker_url="memory://", amqp_events_partitions=3)


def test_a_handler_s_key_comes_from_the_argument_it_names_however_it_is_passed(app):
    @app.handler("accounts.money.moved", ordered_by="account")
    def moved(account: str, amount: int = 0): ...

    handler = app.handlers["accounts.money.moved"]
    assert handler.key_of(("a-1",), {}) == "a-1"
    assert handler.key_of((), {"amount": 3, "account": "a-2"}) == "a-2"
    with pytest.raises(BadArguments, match="no key"):
        handler.key_of((), {"amount": 3})

    @app.handler("accounts.account.closed", ordered_by=lambda account, reason: account.upper())
    def closed(account: str, reason: str): ...

    assert app.handlers["accounts.account.closed"].key_of(("a-3", "fraud"), {}) == "A-3"


def test_ordered_by_must_name_an_argument_of_the_event(app):
    with pytest.raises(TypeError, match="ordered_by='acount' is not one of its event's arguments"):

        @app.handler("accounts.money.moved", ordered_by="acount")
        def moved(account: str): ...

    @dataclasses.dataclass
    class Opened:
        account: str

    opened = app.event("accounts.account.opened")(Opened)

    @app.handler(opened, ordered_by="account")
    def on_opened(event: Opened): ...

    assert app.handlers["accounts.account.opened"].key_of((), {"account": "a-9"}) == "a-9"


def test_ordered_events_share_the_service_s_partitions_instead_of_a_queue_each(app):
    @app.handler("accounts.money.moved", ordered_by="account")
    def moved(account: str): ...

    @app.handler("accounts.account.opened", ordered_by="account")
    def opened(account: str): ...

    @app.handler("reports.day.ended")
    def day_ended(day: str): ...

    topology = app.topology
    consumed = [queue.name for queue in topology.event_queues]
    assert consumed == [
        "ledger:reports.day.ended",
        "ledger.ordered.intake",
        *(partition_queue_name("ledger", n) for n in range(3)),
    ]
    [ordered] = [exchange for exchange in topology.exchanges if exchange.name == "ledger.ordered"]
    assert (ordered.type, ordered.arguments) == ("headers", {"alternate-exchange": "ledger.ordered.intake"})
    for name in consumed[1:]:
        assert topology.queue(name).queue_arguments["x-single-active-consumer"] is True
    routed = {(b.source.name, b.routing_key) for b in topology.bindings if b.destination.name == "ledger.ordered"}
    assert ("events", "accounts.money.moved") in routed and ("events", "accounts.account.opened") in routed
    assert ("events", "reports.day.ended") not in routed
    slots: dict[str, list[str]] = {}
    for binding in slot_bindings(topology):
        assert binding.arguments == {"x-match": "all", "event_slot": binding.routing_key}
        slots.setdefault(binding.destination.name, []).append(binding.routing_key)
    assert sorted(int(slot) for names in slots.values() for slot in names) == list(range(64))  # each slot once
    assert slots["ledger.ordered.01"] == [str(slot) for slot in range(1, 64, 3)]
    parked = [queue.name for queue in topology.queues if queue.name.endswith(".parked")]
    assert parked == ["ledger.ordered.00.parked", "ledger.ordered.01.parked", "ledger.ordered.02.parked"]
    assert "x-dead-letter-exchange" not in topology.queue(parked[0]).queue_arguments  # nothing leaves it but by us


@pytest.mark.parametrize(("name", "ordered"), [("ledger.ordered", True), ("events", False), ("a.b.ordered", False)])
def test_only_a_service_s_ordered_exchange_is_left_to_its_workers_to_declare(name, ordered):
    assert is_ordered_exchange(name) is ordered


def test_the_asyncapi_document_describes_each_ordered_event_s_way_to_its_partitions(app):
    @app.handler("accounts.money.moved", ordered_by="account")
    def moved(account: str): ...

    @app.handler("accounts.account.opened", ordered_by="account")
    def opened(account: str): ...

    described = document(app.context, app.declared_events, "amqp://localhost//")
    for event in ("accounts.money.moved", "accounts.account.opened"):
        channel = described["channels"][f"ledger.ordered:{event}"]
        assert channel["address"] == "ledger.ordered" and list(channel["messages"]) == [event, f"{event}.cloudevent"]
        assert described["operations"][f"handle.{event}"]["channel"] == {"$ref": f"#/channels/ledger.ordered:{event}"}


def test_a_key_s_slot_is_its_crc32_modulo_64_as_any_language_computes_it():
    assert slot_of("123456789") == "38"  # CRC-32's check value 0xCBF43926: its low six bits
    assert slot_of("é") == str(zlib.crc32("é".encode()) % 64)  # of the UTF-8 bytes
    assert {slot_of(f"acct-{n}") for n in range(2000)} == {str(slot) for slot in range(64)}


def slot_bindings(topology):
    """Every binding of the ordered exchange to a queue, each queue's own first one included."""
    own = [
        Binding(queue.exchange, queue, queue.routing_key, queue.binding_arguments)
        for queue in topology.queues
        if queue.exchange is not None and queue.exchange.name == "ledger.ordered"
    ]
    return own + [
        b for b in topology.bindings if b.source.name == "ledger.ordered" and isinstance(b.destination, Queue)
    ]


def test_the_exporter_labels_partitions_as_such(app):
    @app.handler("accounts.money.moved", ordered_by="account")
    def moved(account: str): ...

    kinds = {queue.name: queue_kind(queue.name, app.topology.service) for queue in app.topology.queues}
    assert kinds["ledger.ordered.02"] == "partition" and kinds["ledger.archive"] == "archive"
    assert kinds["ledger.ordered.02.parked"] == "parked"  # no consumer: not a partition


HEAD = "e-1"


@pytest.mark.parametrize(
    ("sequence", "event_id", "headers", "action"),
    [
        (None, "e-2", {}, Action.RUN),  # a key not parked
        (Sequence(HEAD), "e-2", {}, Action.PARK),  # a later event of a parked key
        (Sequence(HEAD), HEAD, {}, Action.RUN_HEAD),  # the head, replayed
        (Sequence(HEAD), "e-9", {"replay_of": HEAD}, Action.RUN_HEAD),  # replayed under a new id
        (Sequence(HEAD), "e-2", {RELEASED_BEHIND: HEAD}, Action.RUN),  # released behind this head
        (Sequence(HEAD), "e-3", {RELEASED_BEHIND: HEAD, RELEASED_LAST: True}, Action.RUN_LAST),
        (Sequence("e-2"), "e-3", {RELEASED_BEHIND: HEAD}, Action.PARK),  # a released one failed: behind it now
        (None, "e-3", {RELEASED_BEHIND: HEAD, RELEASED_LAST: True}, Action.RUN_LAST),  # released twice (a crash)
        (Sequence(HEAD), HEAD, {RELEASE_PARKED: HEAD}, Action.RELEASE),  # the head was discarded
        (Sequence("e-2"), HEAD, {RELEASE_PARKED: HEAD}, Action.DROP),  # ... but the key waits for another
        (None, HEAD, {RELEASE_PARKED: HEAD}, Action.DROP),
    ],
)
def test_a_parked_key_s_messages_wait_unless_they_are_its_head_or_released_behind_it(
    sequence, event_id, headers, action
):
    assert decide(sequence, event_id, headers) is action


def test_an_ordered_handler_parks_by_default_and_may_skip_instead(app):
    @app.handler("accounts.money.moved", ordered_by="account")
    def moved(account: str): ...

    @app.handler("accounts.note.added", ordered_by="account", on_archive="skip")
    def noted(account: str): ...

    @app.handler("reports.day.ended")
    def day_ended(day: str): ...

    parks = {event: handler.parks for event, handler in app.handlers.items()}
    assert parks == {"accounts.money.moved": True, "accounts.note.added": False, "reports.day.ended": False}
    with pytest.raises(TypeError, match="on_archive='drop' is not one of park, skip"):

        @app.handler("accounts.account.closed", ordered_by="account", on_archive="drop")  # type: ignore[arg-type]
        def closed(account: str): ...


def test_parking_headers_belong_to_one_copy_of_a_message():
    headers = {"id": HEAD, "event_key": "a-1", RELEASED_BEHIND: "e-0", RELEASED_LAST: True, PARKS_KEY: "a-1"}
    assert copy_headers(headers, retries=1) == {"id": HEAD, "event_key": "a-1", "retries": 1}


def test_timers_call_in_due_order_never_early_and_cancel_by_tag():
    timers = Timers()
    called: list[tuple[str, float]] = []
    done = threading.Event()
    started = time.monotonic()

    def recorder(name: str):
        return lambda: called.append((name, time.monotonic() - started))

    timers.call_after(0.3, recorder("late"), "p1")
    timers.call_after(0.1, recorder("early"), "p1")
    timers.call_after(0.2, recorder("cancelled"), "p2")
    timers.call_after(0.4, done.set)
    timers.cancel("p2")
    assert done.wait(10)
    assert [name for name, _ in called] == ["early", "late"]
    assert called[0][1] >= 0.1 and called[1][1] >= 0.3  # never before its delay
    timers.call_after(60, recorder("never"))
    assert timers.pending() == 1
    timers.stop()
    assert timers.pending() == 0


def test_a_misspelt_handler_option_is_an_error_listing_the_known_ones(app):
    with pytest.raises(TypeError, match=r"unknown handler option\(s\) ordred_by: the library's are bind, .*ordered_by"):

        @app.handler("accounts.money.moved", ordred_by="account")
        def moved(account: str): ...

    @app.handler("accounts.money.moved", acks_late=True, rate_limit="10/s")  # Celery's own task options
    def fine(account: str): ...
