"""Moving a service between queue layouts (``amqp_events_queue_layout``): what changes on the broker (pure).

The queues of the layout it leaves stop receiving events: each is unbound from
everything that routes to it, after the new layout's queues are declared and
bound (so that no event fired meanwhile reaches neither). What is addressed to
an old queue by its name (a retry waiting on the delay ladder, an archived
event replayed later) is routed to a queue of the new layout instead, by
bindings that stay. The messages an old queue holds are then moved, each to
the queues of the handlers it is for, and the queue is deleted once empty and
unread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from kombu import Exchange, Queue

from amqp_events.settings import QUEUE_LAYOUTS, Settings
from amqp_events.topology import delays
from amqp_events.topology.layout import Binding, Topology, delivery_exchange, own_delivery_exchange
from amqp_events.topology.names import direct_exchange_name, task_of_queue
from amqp_events.topology.service import service_topology


@dataclass(frozen=True)
class Target:
    """A handler of the new layout: its task name, its event, and the queue it takes them from."""

    task: str
    event: str
    queue: str


@dataclass(frozen=True)
class OldQueue:
    """A queue of the layout left behind."""

    name: str
    #: Every route into it (unbound first).
    routes: tuple[Binding, ...]
    #: What reached it by its name, bound to a queue of the new layout (kept).
    redirects: tuple[Binding, ...]


@dataclass(frozen=True)
class Move:
    """A service's move into ``layout``: the old queues, and the handlers their messages go to."""

    service: str
    #: The layout moved to.
    layout: str
    old: tuple[OldQueue, ...]
    #: The handlers of the new layout (unordered: ordered ones keep their partitions), by task name.
    targets: Mapping[str, Target]

    def destinations(self, old_queue: str, headers: Mapping[str, object], event: str) -> list[Target]:
        """The handlers a message of ``old_queue`` with ``headers`` (firing ``event``) is for: the one it names,
        the one whose queue it was in, or every handler of its event (a fired event in a queue they shared)."""
        named = headers.get("for_handler")
        if isinstance(named, str) and named in self.targets:
            return [self.targets[named]]
        of_queue = self.targets.get(task_of_queue(self.service, old_queue) or "")
        if of_queue is not None:
            return [of_queue]
        return [target for target in self.targets.values() if target.event == event]


def other_layout(layout: str) -> str:
    return next(other for other in QUEUE_LAYOUTS if other != layout)


def move_to(
    service: str, tasks: Mapping[str, tuple[str, str]], settings: Settings, ordered: list[str]
) -> tuple[Move, Topology]:
    """The move of ``service`` (handlers by task name: ``(event, queue)`` each, in the new layout) into
    ``settings.queue_layout``, and the new layout's topology."""
    new = service_topology(service, tasks, settings, ordered)
    old = service_topology(service, tasks, replace(settings, queue_layout=other_layout(settings.queue_layout)), ordered)
    targets = {task: Target(task, event, queue) for task, (event, queue) in tasks.items() if task not in ordered}
    kept = {queue.name for queue in new.queues}
    taker = new.queue(min(target.queue for target in targets.values())) if targets else None
    taken = {target.queue for target in targets.values()}
    leaving = []
    for queue in old.event_queues:
        if queue.name in kept or taker is None:
            continue
        routes = [Binding(queue.exchange, queue, queue.routing_key or ""), *_routes_into(old, queue.name)]
        # And what an earlier move the other way routed to it by the new queues' names.
        routes.extend(link for name in sorted(taken) for link in _by_name(service, name, queue, settings))
        leaving.append(OldQueue(queue.name, tuple(routes), _by_name(service, queue.name, taker, settings)))
    return Move(service, settings.queue_layout, tuple(leaving), targets), new


def _routes_into(topology: Topology, queue: str) -> list[Binding]:
    return [link for link in topology.bindings if not link.to_exchange and link.destination.name == queue]


def _by_name(service: str, queue: str, taker: Queue, settings: Settings) -> tuple[Binding, ...]:
    """What reaches ``queue`` by its name (its service's direct exchange, a copy on the ladder sent to it), bound
    to ``taker``."""
    direct = Exchange(direct_exchange_name(service), "direct", durable=True, auto_delete=False)
    on_ladder = delays.destination_pattern(delays.queue_destination(queue))
    redirects = [Binding(direct, taker, queue), Binding(delivery_exchange(settings), taker, on_ladder)]
    if settings.delay_ladder == "per_service":  # and what waits for it in the service's own ladder
        redirects.append(Binding(own_delivery_exchange(service), taker, on_ladder))
    return tuple(redirects)
