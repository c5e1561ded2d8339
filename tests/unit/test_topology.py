"""Topology calculation: pure, no broker."""

from __future__ import annotations

import pytest

from amqp_events.errors import InvalidName
from amqp_events.settings import Settings
from amqp_events.topology import (
    archive_queue_name,
    delays,
    event_queue_name,
    service_topology,
)


def topology(settings: Settings | None = None, events=("billing.invoice.paid", "users.registered")):
    return service_topology("orders", events, settings or Settings())


def test_one_quorum_queue_per_handled_event_bound_to_the_events_exchange():
    queues = {queue.name: queue for queue in topology().event_queues}
    assert set(queues) == {"orders:billing.invoice.paid", "orders:users.registered"}
    queue = queues["orders:billing.invoice.paid"]
    assert (queue.exchange.name, queue.exchange.type, queue.routing_key) == (
        "events",
        "topic",
        "billing.invoice.paid",
    )
    assert queue.durable and not queue.auto_delete
    assert queue.queue_arguments["x-queue-type"] == "quorum"


def test_consumed_queues_dead_letter_through_their_service_s_dead_letter_exchange():
    """Rejected: back to the queue by name (the alternate exchange, the service's direct one). Expired in the
    queue: to the archive (only a first death there: a delayed fire expired on the ladder before)."""
    found = topology()
    queue = found.queue("orders:billing.invoice.paid")
    arguments = queue.queue_arguments
    assert (arguments["x-dead-letter-exchange"], arguments["x-dead-letter-routing-key"]) == (
        "orders.dead-letter",
        "orders:billing.invoice.paid",
    )
    assert arguments["x-dead-letter-strategy"] == "at-least-once"
    [exchange] = [exchange for exchange in found.exchanges if exchange.name == "orders.dead-letter"]
    assert (exchange.type, exchange.arguments) == ("headers", {"alternate-exchange": "orders.direct"})
    expired = {
        link.arguments["x-first-death-queue"]: (link.destination.name, link.arguments)
        for link in found.bindings
        if link.source.name == "orders.dead-letter"
    }
    assert set(expired) == {queue.name for queue in found.event_queues}
    assert expired[queue.name] == (
        "orders.archive",
        {"x-match": "all-with-x", "x-first-death-queue": queue.name, "x-first-death-reason": "expired"},
    )


def test_event_queues_receive_delayed_fires_of_their_event_and_messages_sent_to_them_alone():
    links = sorted(
        (link.source.name, link.routing_key)
        for link in topology().bindings
        if getattr(link.destination, "name", "") == "orders:billing.invoice.paid"
    )
    stars = "*." * delays.LEVELS
    assert links == sorted(
        [
            (delays.DELIVERY_EXCHANGE, stars + "event.billing.invoice.paid"),
            (delays.DELIVERY_EXCHANGE, stars + "queue.orders:billing.invoice.paid"),
            ("orders.delayed", stars + "queue.orders:billing.invoice.paid"),  # its retries, off its own ladder
            ("orders.direct", "orders:billing.invoice.paid"),  # a copy for it alone: a retry, a replay
        ]
    )


def test_a_service_s_own_waits_have_a_ladder_of_their_own_that_reaches_its_queues_alone():
    own = topology(events=["a.b", "c.d"])
    levels = [queue for queue in own.queues if queue.name.startswith("orders.delay.")]
    assert [queue.name for queue in levels] == [delays.own_level_name("orders", level) for level in range(22)]
    assert all(own.is_own(queue.name) for queue in levels)  # its user alone may write to them
    assert {queue.queue_arguments["x-message-ttl"] for queue in levels} == {2**level * 1000 for level in range(22)}
    exits = {(link.source.name, link.destination.name) for link in own.bindings if link.source.name == "orders.delayed"}
    assert exits == {("orders.delayed", "orders:a.b"), ("orders.delayed", "orders:c.d")}
    [gone] = [link for link in own.bindings if link.source.name == "orders.unroutable"]
    assert gone.destination.name == "orders.archive"  # a wait whose queue was removed meanwhile is kept
    shared = topology(Settings(delay_ladder="shared"), events=["a.b"])
    assert not [queue for queue in shared.queues if queue.name.startswith("orders.delay.")]
    assert not [name for name in (queue.name for queue in topology(events=[]).queues) if name.startswith("orders.d")]


def test_the_delay_ladder_has_one_queue_per_power_of_two_shared_by_all_services():
    ladder = [queue for queue in topology().queues if queue.name.startswith("amqp_events.delay.")]
    assert len(ladder) == delays.LEVELS == 22
    ttls = sorted(queue.queue_arguments["x-message-ttl"] for queue in ladder)
    assert ttls == [2**level * 1000 for level in range(22)]
    for queue in ladder:
        assert queue.queue_arguments["x-dead-letter-strategy"] == "at-least-once"
        assert queue.queue_arguments["x-overflow"] == "reject-publish"
    other = service_topology("shipping", ["x.y"], Settings())
    assert [q.name for q in other.queues if q.name.startswith("amqp_events.delay.")] == [q.name for q in ladder]


def test_the_queue_count_does_not_grow_with_events_or_retries():
    few = topology(events=["a.b"])
    many = topology(events=[f"e{n}.x" for n in range(50)])
    assert len(many.queues) - len(few.queues) == 49  # only the event queues themselves
    # the shared ladder, unroutable, archive, one event queue, and the service's own ladder
    assert len(few.queues) == delays.LEVELS + 1 + 1 + 1 + delays.LEVELS


def test_archive_limits_and_zero_meaning_unbounded():
    bounded = topology(Settings(archive_ttl_ms=1000, archive_max_length=5)).archive
    assert bounded.name == archive_queue_name("orders") == "orders.archive"
    assert bounded.queue_arguments["x-message-ttl"] == 1000
    assert bounded.queue_arguments["x-max-length"] == 5
    unbounded = topology(Settings(archive_ttl_ms=0, archive_max_length=0)).archive
    assert "x-message-ttl" not in unbounded.queue_arguments
    assert "x-max-length" not in unbounded.queue_arguments


@pytest.mark.parametrize("service", ["", "a.b", "a:b", "a b", None])
def test_bad_service_names_are_refused(service):
    with pytest.raises(InvalidName):
        event_queue_name(service, "a.b")


@pytest.mark.parametrize("event", ["", "a..b", "a.*", "a.#", ".a", "celery.backend_cleanup", "a b"])
def test_bad_event_names_are_refused(event):
    with pytest.raises(InvalidName):
        event_queue_name("orders", event)


def test_a_custom_events_exchange():
    queue = topology(Settings(exchange="company.events")).queue("orders:users.registered")
    assert queue.exchange.name == "company.events"


def test_the_check_notes_dead_letters_a_queue_holds_with_its_leader():
    from kombu import Queue

    from amqp_events.topology.check import _replicas

    live = {"members": ["a@h", "b@h", "c@h"], "online": ["a@h", "b@h", "c@h"], "leader": "b@h", "messages_dlx": 4}
    [note] = _replicas(Queue("amqp_events.delay.00"), live, group_size=3, nodes=3)
    assert note.kind == "note" and not note.wrong
    assert "4 dead-lettered message(s)" in note.detail and "restart its leader, b@h" in note.detail
    assert _replicas(Queue("q"), {**live, "messages_dlx": 0}, group_size=3, nodes=3) == []


def test_an_untyped_queue_is_classic_on_every_rabbitmq_line():
    """RabbitMQ 4.0 reports a queue declared without a type as classic, 3.10 reports no type: the same queue."""
    from kombu import Queue

    from amqp_events.topology.check import _queue_mismatches

    queue = Queue("orders:a.b", durable=True)
    for reported in ({}, {"x-queue-type": "classic"}):
        assert _queue_mismatches(queue, {"durable": True, "arguments": reported}, "/", nodes=1) == []
    [mismatch] = _queue_mismatches(queue, {"durable": True, "arguments": {"x-queue-type": "quorum"}}, "/", nodes=1)
    assert "x-queue-type is 'quorum' on the broker, this service declares 'classic'" in mismatch.detail


def test_an_archive_rabbitmq_4_would_drop_after_some_reads_is_at_risk_with_the_fix():
    from amqp_events.topology.check import _delivery_limit

    archive = topology(Settings()).archive
    untouched = {"arguments": {}}
    assert _delivery_limit(archive, untouched, "/", limited_by_default=False, browsed=True) == []  # 3.x: no limit
    [risk] = _delivery_limit(archive, untouched, "/", limited_by_default=True, browsed=True)
    assert risk.kind == "at-risk" and risk.wrong
    assert "of 20 (the RabbitMQ 4 default)" in risk.detail
    assert "rabbitmqctl set_policy -p / --apply-to queues" in risk.detail
    assert '"delivery-limit": 2147483647' in risk.detail
    limited = {"arguments": {"x-delivery-limit": 5}}
    [low] = _delivery_limit(archive, limited, "/", limited_by_default=False, browsed=True)
    assert "delivery limit 5" in low.detail
    lifted = {"arguments": {}, "effective_policy_definition": {"delivery-limit": 2**31 - 1}}
    assert _delivery_limit(archive, lifted, "/", limited_by_default=True, browsed=True) == []
    assert _delivery_limit(archive, {"arguments": archive.queue_arguments}, "/", True, browsed=True) == []
    [note] = _delivery_limit(topology().event_queues[0], limited, "/", limited_by_default=True, browsed=False)
    assert not note.wrong and "keep amqp_events_max_redeliveries below it" in note.detail


def test_every_queue_leaves_counting_deliveries_to_the_library():
    """RabbitMQ 4.0's default limit of 20 would dead-letter a message into the queue it came from, which RabbitMQ
    drops as a dead-letter cycle; the library's own count (amqp_events_max_redeliveries) archives it instead."""
    layout = topology(Settings(max_redeliveries=7))
    quorum = [queue for queue in layout.queues if queue.queue_arguments.get("x-queue-type") == "quorum"]
    assert quorum == list(layout.queues)
    assert {queue.queue_arguments["x-delivery-limit"] for queue in quorum} == {2**31 - 1}
