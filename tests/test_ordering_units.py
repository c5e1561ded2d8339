"""Ordered handling, the pure parts: lanes, keys from arguments, the partitions' topology. No broker."""

from __future__ import annotations

import dataclasses

import pytest
from amqp.exceptions import InvalidCommand, PreconditionFailed

from amqp_events import events_app
from amqp_events.asyncapi.document import document
from amqp_events.errors import BadArguments, TopologyMismatch
from amqp_events.exporter import queue_kind
from amqp_events.ordering.lanes import Lanes
from amqp_events.topology import partition_queue_name
from amqp_events.topology.declare import mismatch
from amqp_events.topology.names import is_ordered_exchange


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
    assert consumed == ["ledger:reports.day.ended", "ledger.ordered.00", "ledger.ordered.01", "ledger.ordered.02"]
    [ordered] = [exchange for exchange in topology.exchanges if exchange.name == "ledger.ordered"]
    assert (ordered.type, ordered.arguments) == ("x-consistent-hash", {"hash-header": "event_key"})
    partition = topology.queue(partition_queue_name("ledger", 1))
    assert partition.queue_arguments["x-single-active-consumer"] is True
    routed = {(b.source.name, b.routing_key) for b in topology.bindings if b.destination.name == "ledger.ordered"}
    assert ("events", "accounts.money.moved") in routed and ("events", "accounts.account.opened") in routed
    assert ("events", "reports.day.ended") not in routed


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


@pytest.mark.parametrize(
    "refusal",
    [
        InvalidCommand("COMMAND_INVALID - unknown exchange type 'x-consistent-hash'", reply_code=503),  # 3.x
        PreconditionFailed("PRECONDITION_FAILED - unknown exchange type 'x-consistent-hash'", reply_code=406),  # 4.x
    ],
)
def test_a_broker_without_the_consistent_hash_plugin_gets_the_command_that_enables_it(refusal):
    error = mismatch(refusal)
    assert isinstance(error, TopologyMismatch)
    assert "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange" in str(error)


def test_the_exporter_labels_partitions_as_such(app):
    @app.handler("accounts.money.moved", ordered_by="account")
    def moved(account: str): ...

    kinds = {queue.name: queue_kind(queue.name, app.topology) for queue in app.topology.queues}
    assert kinds["ledger.ordered.02"] == "partition" and kinds["ledger.archive"] == "archive"
