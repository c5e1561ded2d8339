"""The exchanges and queues of a service's ordered handlers (``ordered_by``): its partitions by key slot."""

from __future__ import annotations

from collections.abc import Iterable

from kombu import Exchange, Queue

from amqp_events.settings import Settings
from amqp_events.topology import delays
from amqp_events.topology.layout import (
    Binding,
    consumed_queue_arguments,
    delivery_bindings,
    delivery_exchange,
    events_exchange,
    quorum,
)
from amqp_events.topology.names import (
    EVENT_SLOT_HEADER,
    SLOTS,
    intake_queue_name,
    ordered_exchange_name,
    parked_queue_name,
    partition_queue_name,
    workers_queue_name,
)


def ordered_partitions(
    service: str, events: Iterable[str], settings: Settings
) -> tuple[list[Exchange], list[Queue], list[Binding]]:
    """The ordered exchange of ``service``, bound to the ``events`` handled in order, its partitions and its
    intake queue.

    The exchange (a headers exchange) sends each message to the partition
    of its key's slot (the ``event_slot`` header): slot ``s`` to partition
    ``s % partitions``, whatever happens to the broker. A message without a
    slot goes to the intake queue, where a worker gives it one. Each queue
    has one active consumer at a time, so its messages are taken in the
    order the broker accepted them.
    """
    intake = Exchange(intake_queue_name(service), "fanout", durable=True, auto_delete=False)
    exchange = Exchange(
        ordered_exchange_name(service),
        "headers",
        durable=True,
        auto_delete=False,
        arguments={"alternate-exchange": intake.name},
    )
    delivery = delivery_exchange(settings)
    bindings: list[Binding] = []
    for event in sorted(set(events)):
        bindings.append(Binding(events_exchange(settings), exchange, event))
        bindings.append(Binding(delivery, exchange, delays.destination_pattern(delays.event_destination(event))))
    queues = [one_at_a_time(intake_queue_name(service), intake, "", None, settings)]
    bindings.extend(delivery_bindings(queues[0], (), settings))
    for partition in range(settings.partitions):
        slots = [str(slot) for slot in range(partition, SLOTS, settings.partitions)]
        name = partition_queue_name(service, partition)
        queue = one_at_a_time(name, exchange, slots[0], slot_match(slots[0]), settings)
        queues.append(queue)
        bindings.extend(Binding(exchange, queue, slot, slot_match(slot)) for slot in slots[1:])
        bindings.extend(delivery_bindings(queue, (), settings))
    return [intake, exchange], queues, bindings


def one_at_a_time(
    name: str, exchange: Exchange, routing_key: str, arguments: dict[str, str] | None, settings: Settings
) -> Queue:
    """A queue of the ordered handlers: one consumer at a time takes its messages, in order."""
    return Queue(
        name,
        exchange=exchange,
        routing_key=routing_key,
        binding_arguments=arguments,
        durable=True,
        auto_delete=False,
        queue_arguments={**consumed_queue_arguments(name, settings), "x-single-active-consumer": True},
    )


def slot_match(slot: str) -> dict[str, str]:
    """A binding of the ordered exchange: messages of this slot (the slot is its routing key too, to read)."""
    return {"x-match": "all", EVENT_SLOT_HEADER: slot}


def workers_queue(service: str, settings: Settings) -> Queue:
    """Consumed by every worker of ``service`` (and never given a message): its consumers are its workers."""
    name = workers_queue_name(service)
    return Queue(
        name, exchange=Exchange(""), routing_key=name, durable=True, auto_delete=False, queue_arguments=quorum(settings)
    )


def parked_queues(service: str, settings: Settings) -> list[Queue]:
    """One per partition: the events of keys parked behind an archived event, in order, with a marker per key.

    Only the worker consuming the partition reads and writes it. Unbounded:
    a parked event is an event not yet handled.
    """
    return [
        Queue(
            name,
            exchange=Exchange(""),
            routing_key=name,
            durable=True,
            auto_delete=False,
            queue_arguments=quorum(settings),
        )
        for name in (parked_queue_name(service, partition) for partition in range(settings.partitions))
    ]
