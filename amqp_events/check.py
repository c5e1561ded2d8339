"""Comparing a service's computed topology with what a live broker has."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kombu import Exchange, Queue

from amqp_events import delays
from amqp_events.management import ManagementAPI
from amqp_events.topology import Topology

#: (source exchange, destination, "queue" or "exchange", routing key)
BindingKey = tuple[str, str, str, str]


@dataclass(frozen=True)
class Difference:
    """One way the broker differs from the topology: ``missing``, ``extra`` or ``mismatch``."""

    kind: str
    entity: str
    name: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.entity} {self.name!r}" + (f": {self.detail}" if self.detail else "")


@dataclass
class LiveTopology:
    """What the management API reports for one vhost."""

    exchanges: dict[str, dict[str, Any]] = field(default_factory=dict)
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    bindings: set[BindingKey] = field(default_factory=set)

    @classmethod
    def read(cls, management: ManagementAPI, vhost: str) -> LiveTopology:
        return cls(
            exchanges={item["name"]: item for item in management.exchanges(vhost) if item["name"]},
            queues={item["name"]: item for item in management.queues(vhost)},
            bindings={
                (item["source"], item["destination"], item["destination_type"], item["routing_key"])
                for item in management.bindings(vhost)
                if item["source"]  # every queue is bound to the default exchange: not ours to check
            },
        )


def expected_bindings(topology: Topology) -> set[BindingKey]:
    found: set[BindingKey] = set()
    for queue in topology.queues:
        if queue.exchange is not None and queue.exchange.name:
            found.add((queue.exchange.name, queue.name, "queue", queue.routing_key or ""))
    for link in topology.bindings:
        kind = "queue" if isinstance(link.destination, Queue) else "exchange"
        found.add((link.source.name, link.destination.name, kind, link.routing_key))
    return found


def differences(topology: Topology, live: LiveTopology, vhost: str = "/") -> list[Difference]:
    """Every difference between ``topology`` and ``live`` (empty when they agree)."""
    found: list[Difference] = []
    for exchange in topology.exchanges:
        current = live.exchanges.get(exchange.name)
        if current is None:
            found.append(Difference("missing", "exchange", exchange.name, "run `topology declare` or start a worker"))
        else:
            found.extend(_exchange_mismatches(exchange, current))
    for queue in topology.queues:
        current = live.queues.get(queue.name)
        if current is None:
            found.append(Difference("missing", "queue", queue.name, "run `topology declare` or start a worker"))
        else:
            found.extend(_queue_mismatches(queue, current, vhost))
    ours = {queue.name for queue in topology.queues}
    for name, current in sorted(live.queues.items()):
        if name not in ours and _belongs_to(name, topology.service):
            found.append(
                Difference(
                    "extra",
                    "queue",
                    name,
                    f"no handler of this service uses it; it holds {current.get('messages', 0)} message(s)",
                )
            )
    expected = expected_bindings(topology)
    for source, destination, _, key in sorted(expected - live.bindings):
        found.append(Difference("missing", "binding", f"{source} -> {destination} ({key})", "run `topology declare`"))
    for source, destination, kind, key in sorted(live.bindings - expected):
        if destination in ours and kind == "queue":
            found.append(Difference("extra", "binding", f"{source} -> {destination} ({key})", "not declared by us"))
    return found


def _belongs_to(queue: str, service: str) -> bool:
    return queue.startswith(f"{service}:") or queue.startswith(f"{delays.PREFIX}.")


def _exchange_mismatches(exchange: Exchange, current: dict[str, Any]) -> list[Difference]:
    wanted = {"type": exchange.type, "durable": exchange.durable, **(getattr(exchange, "arguments", None) or {})}
    actual = {"type": current.get("type"), "durable": current.get("durable"), **(current.get("arguments") or {})}
    return [
        Difference("mismatch", "exchange", exchange.name, f"{detail}; delete it, then run `topology declare`")
        for detail in _compare(wanted, actual)
    ]


def _queue_mismatches(queue: Queue, current: dict[str, Any], vhost: str) -> list[Difference]:
    wanted = {"durable": queue.durable, **(getattr(queue, "queue_arguments", None) or {})}
    actual = {"durable": current.get("durable"), **(current.get("arguments") or {})}
    fix = (
        f"move its messages elsewhere, delete it (`rabbitmqctl delete_queue {queue.name!r} -p {vhost!r}`), "
        "then run `topology declare`"
    )
    return [Difference("mismatch", "queue", queue.name, f"{detail}; {fix}") for detail in _compare(wanted, actual)]


def _compare(wanted: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    unset = "(not set)"
    return [
        f"{key} is {actual.get(key, unset)!r} on the broker, this service declares {wanted.get(key, unset)!r}"
        for key in sorted(set(wanted) | set(actual))
        if wanted.get(key) != actual.get(key)
    ]
