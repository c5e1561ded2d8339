"""A service's whole topology: the shared parts, its queues, its ordered partitions and the history."""

from __future__ import annotations

from collections.abc import Iterable

from kombu import Exchange

from amqp_events.settings import Settings
from amqp_events.topology.history import history_cursor_queue, history_stream
from amqp_events.topology.layout import (
    Binding,
    Topology,
    archive_queue,
    dead_letter_routes,
    delay_ladder,
    event_queue,
    events_exchange,
    heartbeats_exchange,
    own_delay_ladder,
    service_queue,
)
from amqp_events.topology.names import check_service_name, direct_exchange_name, event_of, owner_of
from amqp_events.topology.partitioning import ordered_partitions, parked_queues, workers_queue

#: Each service's last topology and what it was made of: the in-process mode makes a service's context again for
#: every test, and a topology (some 50 queues of kombu's) costs a test more than handling its events does.
_LAST: dict[str, tuple[tuple[frozenset[str], frozenset[str], Settings], Topology]] = {}


def service_topology(service: str, events: Iterable[str], settings: Settings, ordered: Iterable[str] = ()) -> Topology:
    """The topology of ``service`` handling ``events`` (its handlers' task names: events, and ``<event>:<name>``
    for named handlers), those in ``ordered`` one at a time per key, its queues laid out as
    ``settings.queue_layout`` says."""
    made_of = (frozenset(events), frozenset(ordered), settings)
    last = _LAST.get(service)
    if last is not None and last[0] == made_of:
        return last[1]
    topology = _made(service, made_of[0], settings, made_of[1])
    _LAST[service] = (made_of, topology)
    return topology


def _made(service: str, events: frozenset[str], settings: Settings, ordered: frozenset[str]) -> Topology:
    exchanges, queues, bindings = delay_ladder(settings)
    event_queues = []
    unordered = sorted(events - ordered)
    if settings.queue_layout == "per_service" and unordered:
        queue, its_bindings = service_queue(service, sorted({event_of(task) for task in unordered}), settings)
        event_queues.append(queue)
        bindings.extend(its_bindings)
    elif settings.queue_layout == "per_handler":
        for task in unordered:
            queue, its_bindings = event_queue(service, task, settings)
            event_queues.append(queue)
            bindings.extend(its_bindings)
    if ordered:
        its_exchanges, partitions, its_bindings = ordered_partitions(service, ordered, settings)
        exchanges.extend(its_exchanges)
        event_queues.extend(partitions)
        bindings.extend(its_bindings)
        queues.extend([*parked_queues(service, settings), workers_queue(service, settings)])
    if settings.history:
        stream, its_bindings = history_stream(settings)
        queues.extend([stream, history_cursor_queue(service, settings)])
        bindings.extend(its_bindings)
    archive = archive_queue(service, settings)
    queues = [*queues, archive, *event_queues]
    # Each of its queues by its name on its own direct exchange: how its copies reach one queue alone.
    direct = Exchange(direct_exchange_name(service), "direct", durable=True, auto_delete=False)
    bindings.extend(Binding(direct, queue, queue.name) for queue in queues if owner_of(queue.name) == service)
    dead_letter, expired = dead_letter_routes(service, event_queues, archive)
    bindings.extend(expired)
    own: list[Exchange] = []
    # Every level declared with the rest at start, never when a wait first needs it: RabbitMQ 3.10 can lose a quorum
    # queue declared about 2 s before a crash, with the waits just confirmed into it (tests/broker/test_durability.py).
    if event_queues and settings.delay_ladder == "per_service":  # declared after the queues its exit reaches
        own, own_queues, own_bindings = own_delay_ladder(service, event_queues, archive, settings)
        queues.extend(own_queues)
        bindings.extend(own_bindings)
    return Topology(
        service=check_service_name(service),
        exchanges=(events_exchange(settings), *exchanges, heartbeats_exchange(settings), direct, dead_letter, *own),
        queues=tuple(queues),
        bindings=tuple(bindings),
        event_queues=tuple(event_queues),
        archive=archive,
        checks_shared=settings.checks_shared_topology,
    )
