"""A service's exchanges, queues and bindings, computed as plain kombu objects.

Nothing here talks to a broker: :mod:`amqp_events.transport.declare` does that. The
layout (docs/reference/topology.md) for a service ``orders`` handling ``E`` events:

* ``events`` (topic): every fired event, routing key = event name.
* ``orders:<event>`` (quorum queue, one per handled event): bound to
  ``events`` with the event name, and to the delivery exchange for delayed
  fires of that event and for messages sent to this queue alone (retries,
  replays). Rejected messages dead-letter back to it through
  ``orders.dead-letter`` so that the worker can count them; expired ones go to
  the archive (:func:`dead_letter_routes`).
* ``orders.ordered`` (headers exchange, on the ``event_slot`` header), its
  partitions ``orders.ordered.00``... and ``orders.ordered.intake`` for events
  without a slot (quorum queues, one active consumer each), and a parked queue
  per partition, when the service has ordered handlers: their events go there
  instead of to ``orders:<event>``.
* ``orders.archive`` (quorum queue, bounded by TTL and length).
* With history on: ``amqp_events.history`` (a stream shared by the vhost's
  services) bound to ``events`` with ``#`` and to the delivery exchange for
  delayed fires, and ``orders.history.cursor`` (how far a replay got).
* The delay ladder (:mod:`amqp_events.topology.delays`): 22 exchanges and 22 quorum
  queues shared by every service on the vhost, the delivery exchange, and
  ``amqp_events.unroutable`` for delayed messages whose destination is gone.
"""

from __future__ import annotations

import json
import re
import shlex
import uuid
from dataclasses import dataclass, field

from kombu import Exchange, Queue

from amqp_events.settings import Settings
from amqp_events.topology import delays
from amqp_events.topology.names import (
    archive_queue_name,
    dead_letter_exchange_name,
    direct_exchange_name,
    event_of,
    event_queue_name,
    owner_of,
    service_queue_name,
)

#: How a queue dead-letters (its dead-letter exchange and routing key).
DEAD_LETTERING = ("x-dead-letter-exchange", "x-dead-letter-routing-key")
#: Arguments that only place a quorum queue's replicas (RabbitMQ reads them when it creates the queue).
PLACEMENT = ("x-quorum-initial-group-size", "x-queue-leader-locator")
#: RabbitMQ's bound on how often a quorum queue gives a message out without an outcome; past it the message is
#: dead-lettered. The library counts deliveries itself (``amqp_events_max_redeliveries``) and archives, so every
#: queue of its own says "no limit": RabbitMQ 4.0 would otherwise apply 20, and a message it dead-letters back into
#: the queue it came from is dropped as a dead-letter cycle; an archive (read by taking messages and giving them
#: back) would lose a message on its 21st read. (-1, "no limit" on 4.0, means 0 on 3.10.)
DELIVERY_LIMIT = "x-delivery-limit"
NO_DELIVERY_LIMIT = 2**31 - 1
#: The history's retention: the first service to declare it sets it, the others keep it (a policy changes it).
RETENTION = ("x-max-age", "x-max-length-bytes", "x-stream-max-segment-size-bytes")
#: Arguments an existing queue may lack (created by an earlier version, or by hand) or have otherwise: it is kept
#: as it is (see :func:`amqp_events.transport.declare.declare_topology`), and ``topology check`` notes it.
KEPT_AS_THEY_ARE = (*PLACEMENT, DELIVERY_LIMIT, *RETENTION, *DEAD_LETTERING, "x-overflow")
#: Dead-lettering that waits for the target queue's confirm instead of dropping on failure.
SAFE_DEAD_LETTERING: dict[str, object] = {
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
}
#: Bounds of the shared unroutable queue; constant so that every service declares it alike.
UNROUTABLE_TTL_MS = 7 * 24 * 3600 * 1000
UNROUTABLE_MAX_LENGTH = 10_000


def shared_exchange(name: str, kind: str, settings: Settings, **arguments: object) -> Exchange:
    """An exchange every service of the vhost shares: declared passively (only checked) when an administrator
    declares the shared topology (``amqp_events_shared_topology = "check"``)."""
    return Exchange(
        name,
        kind,
        durable=True,
        auto_delete=False,
        arguments=arguments or None,
        passive=settings.checks_shared_topology,
    )


def events_exchange(settings: Settings) -> Exchange:
    return shared_exchange(settings.exchange, "topic", settings)


#: Where workers announce themselves every few seconds (read by ``amqp-events exporter``).
HEARTBEATS = f"{delays.PREFIX}.heartbeats"


def heartbeats_exchange(settings: Settings) -> Exchange:
    return shared_exchange(HEARTBEATS, "fanout", settings)


def heartbeats_listener(service: str, listener: str, settings: Settings) -> Queue:
    """A private queue of ``service`` receiving every heartbeat while ``listener`` (the exporter, the CLI) reads
    them (named after the service: its user may create it)."""
    return Queue(
        f"{service}.{listener}.{uuid.uuid4().hex[:12]}",
        exchange=heartbeats_exchange(settings),
        exclusive=True,
        auto_delete=True,
        durable=False,
        queue_arguments={"x-message-ttl": 60_000},
    )


def delivery_exchange(settings: Settings) -> Exchange:
    return shared_exchange(delays.DELIVERY_EXCHANGE, "topic", settings, **{"alternate-exchange": delays.UNROUTABLE})


def bounded(ttl_ms: int, max_length: int) -> dict[str, object]:
    """Queue arguments for TTL and length bounds, where 0 means "no bound" (not "keep nothing")."""
    arguments: dict[str, object] = {}
    if ttl_ms:
        arguments["x-message-ttl"] = ttl_ms
    if max_length:
        arguments["x-max-length"] = max_length
    return arguments


@dataclass(frozen=True)
class Binding:
    """``destination`` (a queue or an exchange) receives what ``source`` routes with ``routing_key``.

    A queue's first binding is part of its kombu ``Queue`` (its ``exchange``
    and ``routing_key``, which Celery's consumer also declares); the others
    are listed separately because kombu's ``Queue(bindings=...)`` would drop
    the first one.
    """

    source: Exchange
    destination: Queue | Exchange
    routing_key: str
    #: What a headers exchange matches (the ordered exchange's slot bindings).
    arguments: dict[str, str] | None = field(default=None, compare=False, hash=False)

    @property
    def to_exchange(self) -> bool:
        """Does it bind an exchange to another exchange (not to a queue)?"""
        return isinstance(self.destination, Exchange)


@dataclass(frozen=True)
class Topology:
    """Everything one service needs on the broker, in declaration order."""

    service: str
    exchanges: tuple[Exchange, ...]
    queues: tuple[Queue, ...]
    #: Bindings besides each queue's own exchange and routing key, declared after the queues.
    bindings: tuple[Binding, ...]
    #: The queues the service's workers consume (a subset of ``queues``).
    event_queues: tuple[Queue, ...]
    archive: Queue
    #: Declare only what is the service's own, and check that the shared parts are there
    #: (``amqp_events_shared_topology = "check"``).
    checks_shared: bool = False

    def is_own(self, name: str) -> bool:
        """Is the exchange or queue ``name`` this service's own (not shared with the vhost's other services)?"""
        return owner_of(name) == self.service

    def queue(self, name: str) -> Queue:
        for queue in self.queues:
            if queue.name == name:
                return queue
        raise KeyError(name)


def quorum(settings: Settings) -> dict[str, object]:
    """A replicated quorum queue: on ``amqp_events_quorum_group_size`` nodes (or as many as the cluster
    has), its leader on the node with the fewest leaders."""
    arguments: dict[str, object] = {
        "x-queue-type": "quorum",
        "x-queue-leader-locator": "balanced",
        DELIVERY_LIMIT: NO_DELIVERY_LIMIT,
    }
    if settings.quorum_group_size:
        arguments["x-quorum-initial-group-size"] = settings.quorum_group_size
    return arguments


def refusing_past(max_bytes: int) -> dict[str, object]:
    """A shared queue's bound: past it the broker refuses a publish (a nack to its publisher, or a dead letter
    that waits) instead of dropping what the queue holds."""
    return {"x-max-length-bytes": max_bytes, "x-overflow": "reject-publish"}


def delay_ladder(settings: Settings) -> tuple[list[Exchange], list[Queue], list[Binding]]:
    """The shared delay ladder, the delivery exchange and the unroutable catch-all."""
    unroutable_exchange = shared_exchange(delays.UNROUTABLE, "fanout", settings)
    delivery = delivery_exchange(settings)
    queues = [
        Queue(
            delays.UNROUTABLE,
            exchange=unroutable_exchange,
            routing_key="",
            durable=True,
            auto_delete=False,
            queue_arguments={
                **quorum(settings),
                **bounded(UNROUTABLE_TTL_MS, UNROUTABLE_MAX_LENGTH),
                **refusing_past(settings.shared_queue_max_bytes),
            },
        )
    ]
    levels = [shared_exchange(delays.level_name(level), "topic", settings) for level in range(delays.LEVELS)]
    level_queues, bindings = ladder_levels(levels, delivery, settings)
    return [unroutable_exchange, delivery, *levels], [*queues, *level_queues], bindings


def own_delay_ladder(
    service: str, consumed: list[Queue], archive: Queue, settings: Settings
) -> tuple[list[Exchange], list[Queue], list[Binding]]:
    """``service``'s own delay ladder (``amqp_events_delay_ladder = "per_service"``): its levels, then its own
    delivery exchange, which reaches each of ``consumed`` by ``queue.<name>``; what it cannot route (a queue
    removed meanwhile) goes to the archive."""
    unroutable = Exchange(own_unroutable(service), "fanout", durable=True, auto_delete=False)
    delivery = own_delivery_exchange(service)
    levels = [
        Exchange(delays.own_level_name(service, level), "topic", durable=True, auto_delete=False)
        for level in range(delays.LEVELS)
    ]
    queues, bindings = ladder_levels(levels, delivery, settings)
    bindings.append(Binding(unroutable, archive, ""))
    bindings.extend(
        Binding(delivery, queue, delays.destination_pattern(delays.queue_destination(queue.name))) for queue in consumed
    )
    return [unroutable, delivery, *levels], queues, bindings


def own_unroutable(service: str) -> str:
    return f"{service}.unroutable"


def own_delivery_exchange(service: str) -> Exchange:
    """Where ``service``'s own ladder hands its waits over to its queues (a queue gone: to its archive)."""
    return Exchange(
        delays.own_delivery(service), "topic", durable=True, auto_delete=False,
        arguments={"alternate-exchange": own_unroutable(service)},
    )  # fmt: skip


def ladder_levels(levels: list[Exchange], delivery: Exchange, settings: Settings) -> tuple[list[Queue], list[Binding]]:
    """The queues of a ladder's ``levels`` (exchanges, lowest first) and how they hand a message down: a level's
    exchange sends it into the level's queue when its bit is 1 and on to the next level's exchange when 0; the
    queue dead-letters it, once its wait is over, to the next level's exchange; after level 0 comes ``delivery``."""
    queues, bindings = [], []
    for level, exchange in enumerate(levels):
        after = levels[level - 1] if level else delivery
        bindings.append(Binding(exchange, after, delays.bit_pattern(level, "0")))
        queues.append(
            Queue(
                exchange.name,
                exchange=exchange,
                routing_key=delays.bit_pattern(level, "1"),
                durable=True,
                auto_delete=False,
                queue_arguments={
                    **quorum(settings),
                    **SAFE_DEAD_LETTERING,
                    **refusing_past(settings.shared_queue_max_bytes),
                    "x-message-ttl": delays.level_ttl_ms(level),
                    "x-dead-letter-exchange": after.name,
                },
            )
        )
    return queues, bindings


def event_queue(service: str, task: str, settings: Settings) -> tuple[Queue, list[Binding]]:
    """The queue of ``service``'s handler ``task`` (an event's name, or a named handler's ``<event>:<name>``),
    bound to the events exchange with its event, and its delivery bindings."""
    name = event_queue_name(service, task)
    event = event_of(task)
    queue = Queue(
        name,
        exchange=events_exchange(settings),
        routing_key=event,
        durable=True,
        auto_delete=False,
        queue_arguments=consumed_queue_arguments(name, settings),
    )
    return queue, delivery_bindings(queue, (event,), settings)


def service_queue(service: str, events: list[str], settings: Settings) -> tuple[Queue, list[Binding]]:
    """The one queue of ``service``'s handlers of ``events`` (``amqp_events_queue_layout = "per_service"``),
    bound to the events exchange with each, and its delivery bindings."""
    name = service_queue_name(service)
    exchange = events_exchange(settings)
    queue = Queue(
        name,
        exchange=exchange,
        routing_key=events[0],
        durable=True,
        auto_delete=False,
        queue_arguments=consumed_queue_arguments(name, settings),
    )
    more = [Binding(exchange, queue, event) for event in events[1:]]
    return queue, [*more, *delivery_bindings(queue, events, settings)]


def consumed_queue_arguments(name: str, settings: Settings) -> dict[str, object]:
    """The arguments of a queue the service's workers consume: replicated, dead-lettering safely through the
    service's dead-letter exchange (:func:`dead_letter_routes`)."""
    owner = owner_of(name)
    assert owner is not None, name  # a consumed queue's name starts with its service's
    return {
        **quorum(settings),
        **SAFE_DEAD_LETTERING,
        "x-dead-letter-exchange": dead_letter_exchange_name(owner),
        "x-dead-letter-routing-key": name,
    }


def earlier_dead_lettering(name: str) -> dict[str, object]:
    """How a consumed queue created by 0.2 dead-letters: straight back through the delivery exchange. Such a
    queue is kept as it is (RabbitMQ never changes a queue's arguments); a message that expires in it stays in
    its dead-letter buffer until it is deleted and declared again."""
    return {
        "x-dead-letter-exchange": delays.DELIVERY_EXCHANGE,
        "x-dead-letter-routing-key": delays.routing_key(0, delays.queue_destination(name)),
    }


def dead_letter_routes(service: str, consumed: list[Queue], archive: Queue) -> tuple[Exchange, list[Binding]]:
    """The service's dead-letter exchange and its bindings.

    A rejected message (its worker was lost) goes back to its queue by name through the alternate exchange
    (the service's direct one), with an ``x-death`` entry the worker counts. A message that expired in the
    queue (an AMQP ``expiration`` its publisher set) goes to the archive: RabbitMQ drops, or with at-least-once
    dead-lettering strands, a message that expires back into the queue it expired from. Only its first death
    tells (``x-first-death-*``): a delayed fire expired on the ladder before it reached the queue.
    """
    exchange = Exchange(
        dead_letter_exchange_name(service),
        "headers",
        durable=True,
        auto_delete=False,
        arguments={"alternate-exchange": direct_exchange_name(service)},
    )
    expired = [
        Binding(
            exchange,
            archive,
            queue.name,
            {"x-match": "all-with-x", "x-first-death-queue": queue.name, "x-first-death-reason": "expired"},
        )
        for queue in consumed
    ]
    return exchange, expired


def delivery_bindings(queue: Queue, events: tuple[str, ...] | list[str], settings: Settings) -> list[Binding]:
    """What the delivery exchange brings ``queue``: delayed fires of ``events``, and copies sent to it alone."""
    delivery = delivery_exchange(settings)
    return [
        *(Binding(delivery, queue, delays.destination_pattern(delays.event_destination(event))) for event in events),
        Binding(delivery, queue, delays.destination_pattern(delays.queue_destination(queue.name))),
    ]


def archive_queue(service: str, settings: Settings) -> Queue:
    return Queue(
        archive_queue_name(service),
        exchange=Exchange(""),
        routing_key=archive_queue_name(service),
        durable=True,
        auto_delete=False,
        queue_arguments={
            **quorum(settings),
            **bounded(settings.archive_ttl_ms, settings.archive_max_length),
        },
    )


def no_delivery_limit_policy(queue: str, vhost: str) -> str:
    """The command that lifts the delivery limit of ``queue``, created without the library's own."""
    pattern = "^" + re.escape(queue) + "$"
    definition = json.dumps({"delivery-limit": NO_DELIVERY_LIMIT})
    return (
        f"rabbitmqctl set_policy -p {shlex.quote(vhost)} --apply-to queues --priority 10 "
        f"{shlex.quote(queue + '-delivery-limit')} {shlex.quote(pattern)} {shlex.quote(definition)}"
    )
