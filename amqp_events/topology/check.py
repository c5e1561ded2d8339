"""Comparing a service's computed topology with what a live broker has, replicas included."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kombu import Exchange, Queue

from amqp_events.topology import delays, sizing
from amqp_events.topology.layout import (
    DELIVERY_LIMIT,
    KEPT_AS_THEY_ARE,
    NO_DELIVERY_LIMIT,
    Topology,
    no_delivery_limit_policy,
)
from amqp_events.topology.names import ordered_exchange_name, service_queue_name

#: (source exchange, destination, "queue" or "exchange", routing key)
BindingKey = tuple[str, str, str, str]


@dataclass(frozen=True)
class Difference:
    """One way the broker differs from the topology.

    ``missing``, ``extra``, ``mismatch``, ``under-replicated``, ``leaderless``, ``at-risk``; or a ``note``,
    which is worth knowing but not wrong (``topology check`` still succeeds).
    """

    kind: str
    entity: str
    name: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.entity} {self.name!r}" + (f": {self.detail}" if self.detail else "")

    @property
    def wrong(self) -> bool:
        return self.kind != "note"


@dataclass
class LiveTopology:
    """What the management API reports for one vhost."""

    exchanges: dict[str, dict[str, Any]] = field(default_factory=dict)
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    bindings: set[BindingKey] = field(default_factory=set)
    #: The cluster's nodes (running or not).
    nodes: list[str] = field(default_factory=list)
    #: The RabbitMQ version of the node that answered ("" when unknown).
    version: str = ""

    @property
    def limits_deliveries_by_default(self) -> bool:
        """RabbitMQ 4.0 and later give quorum queues that do not say a delivery limit of 20."""
        major = self.version.split(".", 1)[0]
        return major.isdigit() and int(major) >= 4


def expected_bindings(topology: Topology) -> set[BindingKey]:
    found: set[BindingKey] = set()
    for queue in topology.queues:
        if queue.exchange is not None and queue.exchange.name:
            found.add((queue.exchange.name, queue.name, "queue", queue.routing_key or ""))
    for link in topology.bindings:
        kind = "queue" if isinstance(link.destination, Queue) else "exchange"
        found.add((link.source.name, link.destination.name, kind, link.routing_key))
    return found


def differences(
    topology: Topology, live: LiveTopology, vhost: str = "/", quorum_queue_warning: int = 0
) -> list[Difference]:
    """Every difference between ``topology`` and ``live`` (empty when they agree), and a note when the vhost holds
    more than ``quorum_queue_warning`` quorum queues (0: never)."""
    found: list[Difference] = []
    held = sizing.quorum_queues(live.queues.values())
    if quorum_queue_warning and held > quorum_queue_warning:
        found.append(
            Difference(
                "note",
                "vhost",
                vhost,
                f"{held:,} quorum queues, more than amqp_events_quorum_queue_warning ({quorum_queue_warning:,}): "
                f"{sizing.cost(held)} (the reference on topology, sizing)",
            )
        )
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
            found.extend(_queue_mismatches(queue, current, vhost, len(live.nodes)))
            browsed = queue.name == topology.archive.name
            found.extend(_delivery_limit(queue, current, vhost, live.limits_deliveries_by_default, browsed))
    ours = {queue.name for queue in topology.queues}
    for name, current in sorted(live.queues.items()):
        if name not in ours and _belongs_to(name, topology.service):
            holds = f"it holds {current.get('messages', 0)} message(s)"
            left = _left_by_a_move(topology, name)
            detail = (
                f"left from the {left} layout; {holds}: run `topology move`" if left else f"no handler uses it; {holds}"
            )
            found.append(Difference("extra", "queue", name, detail))
    expected = expected_bindings(topology)
    for source, destination, _, key in sorted(expected - live.bindings):
        found.append(Difference("missing", "binding", f"{source} -> {destination} ({key})", "run `topology declare`"))
    for source, destination, kind, key in sorted(live.bindings - expected):
        if destination in ours and kind == "queue":
            named = _by_name_key(key)
            if named not in ours and _left_by_a_move(topology, named):
                why = f"kept by `topology move`: retries and replays sent to {named} by its name come here"
                found.append(Difference("note", "binding", f"{source} -> {destination} ({key})", why))
            else:
                found.append(Difference("extra", "binding", f"{source} -> {destination} ({key})", "not declared by us"))
    return found


def _left_by_a_move(topology: Topology, queue: str) -> str:
    """The layout whose queue of this service ``queue`` is, when it is not the topology's own one ("" if not)."""
    service = topology.service
    shared = service_queue_name(service)
    if any(own.name == shared for own in topology.event_queues):
        return "per_handler" if queue.startswith(f"{service}:") else ""
    return "per_service" if queue == shared else ""


def _by_name_key(key: str) -> str:
    """The queue a routing key names (a direct exchange's key, or the ladder's ``...queue.<name>`` pattern)."""
    marker = ".queue."
    return key.split(marker, 1)[1] if marker in key else key


def _belongs_to(queue: str, service: str) -> bool:
    """Is ``queue`` one of the service's kind (an event queue, a partition) or of the shared delay ladder (not the
    history stream, which another service may keep, nor a listener's private queue)?"""
    return queue == service_queue_name(service) or queue.startswith(
        (f"{service}:", f"{ordered_exchange_name(service)}.", f"{service}.delay.", delays.level_name(0)[:-2])
    )


def _exchange_mismatches(exchange: Exchange, current: dict[str, Any]) -> list[Difference]:
    wanted = {"type": exchange.type, "durable": exchange.durable, **(getattr(exchange, "arguments", None) or {})}
    actual = {"type": current.get("type"), "durable": current.get("durable"), **(current.get("arguments") or {})}
    return [
        Difference("mismatch", "exchange", exchange.name, f"{detail}; delete it, then run `topology declare`")
        for detail in _compare(wanted, actual)
    ]


def _queue_mismatches(queue: Queue, current: dict[str, Any], vhost: str, nodes: int) -> list[Difference]:
    wanted = {"durable": queue.durable, **(getattr(queue, "queue_arguments", None) or {})}
    actual = {"durable": current.get("durable"), **(current.get("arguments") or {})}
    # RabbitMQ 4.0 reports a queue declared without a type as classic; 3.10 reports no type.
    for arguments in (wanted, actual):
        arguments.setdefault("x-queue-type", "classic")
    fix = (
        f"move its messages elsewhere, delete it (`rabbitmqctl delete_queue {queue.name!r} -p {vhost!r}`), "
        "then run `topology declare`"
    )
    found = [Difference("mismatch", "queue", queue.name, f"{detail}; {fix}") for detail in _compare(wanted, actual)]
    kept = [
        argument for argument in KEPT_AS_THEY_ARE if argument in wanted and wanted[argument] != actual.get(argument)
    ]
    if kept:  # a queue created before or by hand: declare_topology keeps it as it is
        found = [difference for difference in found if not any(argument in difference.detail for argument in kept)]
        absent = [argument for argument in kept if argument not in actual]
        other = [f"{argument}={actual[argument]!r}" for argument in kept if argument in actual]
        said = ([f"created without {', '.join(absent)}"] if absent else []) + (
            [f"created with {', '.join(other)}"] if other else []
        )
        found.append(Difference("note", "queue", queue.name, f"{'; '.join(said)}: kept as it is"))
    return found + _replicas(queue, current, int(wanted.get("x-quorum-initial-group-size") or 0), nodes)


def _delivery_limit(
    queue: Queue, current: dict[str, Any], vhost: str, limited_by_default: bool, browsed: bool
) -> list[Difference]:
    """A queue that would drop a message given out too often without an outcome (RabbitMQ's delivery limit).

    For the archive that is a loss waiting to happen (every read counts); for an event queue a bound the library's
    own count (``amqp_events_max_redeliveries``) must stay below.
    """
    policy = (current.get("effective_policy_definition") or {}).get("delivery-limit")
    limit = (current.get("arguments") or {}).get(DELIVERY_LIMIT, policy)
    if limit is not None and limit >= NO_DELIVERY_LIMIT:
        return []
    if limit is None and not limited_by_default:
        return []  # RabbitMQ 3.x: no limit unless one is set
    said = f"delivery limit {limit if limit is not None else 'of 20 (the RabbitMQ 4 default)'}"
    fix = f"lift it with `{no_delivery_limit_policy(queue.name, vhost)}`"
    if browsed:
        return [Difference("at-risk", "queue", queue.name, f"{said}: a message read that often is dropped; {fix}")]
    detail = f"{said}: keep amqp_events_max_redeliveries below it, or {fix}"
    return [Difference("note", "queue", queue.name, detail)]


def _replicas(queue: Queue, current: dict[str, Any], group_size: int, nodes: int) -> list[Difference]:
    """A quorum queue's replicas: fewer members than configured (0: one per node), no leader, members offline."""
    members, online = current.get("members"), current.get("online") or []
    if members is None:  # not a quorum queue, or the management API does not say
        return []
    found = []
    expected = min(group_size or nodes, nodes)
    if len(members) < expected:
        found.append(
            Difference(
                "under-replicated", "queue", queue.name,
                f"{len(members)} member(s) of {expected} ({', '.join(members)}); add one with "
                f"`rabbitmq-queues add_member {queue.name!r} NODE`",
            )
        )  # fmt: skip
    stream_leader = current.get("node") if current.get("type") == "stream" else None  # a stream says "node"
    if not (current.get("leader") or stream_leader):
        found.append(Difference("leaderless", "queue", queue.name, "no leader: it delivers nothing"))
    offline = sorted(set(members) - set(online))
    if offline:
        found.append(Difference("note", "queue", queue.name, f"member(s) offline: {', '.join(offline)}"))
    held = current.get("messages_dlx") or 0
    if held:
        found.append(
            Difference(
                "note", "queue", queue.name,
                f"{held} dead-lettered message(s) wait for their target queue's confirm; if the count stays, "
                f"a node loss stranded them (RabbitMQ 3.10, RELIABILITY.md): restart its leader, "
                f"{current.get('leader') or '?'}, to send them on",
            )
        )  # fmt: skip
    return found


def _compare(wanted: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    unset = "(not set)"
    return [
        f"{key} is {actual.get(key, unset)!r} on the broker, this service declares {wanted.get(key, unset)!r}"
        for key in sorted(set(wanted) | set(actual))
        if wanted.get(key) != actual.get(key)
    ]
