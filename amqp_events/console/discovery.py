"""The services on a vhost, found by the library's naming in the management API's list of queues. Pure: no I/O.

Every service with a handler has an archive, ``<service>.archive``; its
other queues are named ``<service>:<event>`` (one per handled event) or
``<service>.<something>`` (partitions, parked queues, the history cursor).
A service that only fires has no queue, and nothing to show.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from amqp_events.errors import InvalidName
from amqp_events.topology.names import check_service_name, is_event_queue, owner_of

ARCHIVE_SUFFIX = ".archive"


@dataclass(frozen=True)
class QueueState:
    """One queue as the management API last saw it."""

    name: str
    ready: int
    unacked: int
    consumers: int
    #: Messages per second into the queue and acknowledged out of it (``None``: no rate known yet).
    incoming: float | None
    acked: float | None
    #: A quorum queue's or stream's replicas, and how many of them are online (``None``: not replicated).
    replicas: int | None = None
    online: int | None = None

    @property
    def replicas_missing(self) -> bool:
        return self.online is not None and self.replicas is not None and self.online < self.replicas

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> QueueState:
        stats = item.get("message_stats") or {}
        return cls(
            name=str(item["name"]),
            ready=int(item.get("messages_ready") or 0),
            unacked=int(item.get("messages_unacknowledged") or 0),
            consumers=int(item.get("consumers") or 0),
            incoming=_rate(stats, "publish_details"),
            acked=_rate(stats, "ack_details"),
            replicas=len(item["members"]) if isinstance(item.get("members"), list) else None,
            online=len(item["online"]) if isinstance(item.get("online"), list) else None,
        )


#: Points of a series over time: ``(unix time in seconds, value)``, oldest first.
Series = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class ServiceQueues:
    """A service found on the vhost: its archive's size and its other queues."""

    name: str
    archived: int
    queues: tuple[QueueState, ...] = field(default=())
    #: The archive's size, sampled (when the listing had samples).
    archived_over_time: Series = ()
    #: Events handled (acks of its event queues) in each interval between two samples.
    handled_over_time: Series = ()

    @property
    def consumers(self) -> int:
        """Consumers of its event queues (a worker consumes each of them once)."""
        return max((queue.consumers for queue in self.queues if is_event_queue(queue.name, self.name)), default=0)


def services_in(listing: Iterable[Mapping[str, Any]]) -> list[ServiceQueues]:
    """The services whose queues are in ``listing`` (the management API's ``/api/queues/<vhost>``), by name."""
    items = {str(item["name"]): item for item in listing}
    names = sorted(
        name[: -len(ARCHIVE_SUFFIX)]
        for name in items
        if name.endswith(ARCHIVE_SUFFIX) and _is_service_name(name[: -len(ARCHIVE_SUFFIX)])
    )
    found = []
    for service in names:
        archive = f"{service}{ARCHIVE_SUFFIX}"
        own = sorted(name for name in items if name != archive and owner_of(name) == service)
        event_queues = [items[name] for name in own if is_event_queue(name, service)]
        found.append(
            ServiceQueues(
                service,
                int(items[archive].get("messages") or 0),
                tuple(QueueState.of(items[name]) for name in own),
                _samples(items[archive].get("messages_details")),
                increments(
                    summed(_samples((item.get("message_stats") or {}).get("ack_details")) for item in event_queues)
                ),
            )
        )
    return found


def subscribers(bindings: Iterable[Mapping[str, Any]], exchange: str) -> dict[str, list[str]]:
    """The services each event reaches: the owners of what the events ``exchange`` routes it to (a queue, or an
    ordered exchange), from the management API's ``/api/bindings/<vhost>`` (the shared history stream is no one's)."""
    found: dict[str, set[str]] = {}
    for binding in bindings:
        owner = owner_of(str(binding.get("destination") or ""))
        if binding.get("source") == exchange and owner:
            found.setdefault(str(binding.get("routing_key") or ""), set()).add(owner)
    return {event: sorted(services) for event, services in sorted(found.items())}


def _samples(details: Any) -> Series:
    """The management API's ``samples`` (newest first, times in milliseconds), oldest first, in seconds."""
    samples = details.get("samples") if isinstance(details, Mapping) else None
    points = [(sample["timestamp"] / 1000, float(sample["sample"])) for sample in samples or ()]
    return tuple(sorted(points))


def increments(counts: Series) -> Series:
    """A running count's growth between consecutive samples, at the later one (a counter reset counts 0)."""
    return tuple((later, max(0.0, value - before)) for (_, before), (later, value) in itertools.pairwise(counts))


def summed(all_series: Iterable[Series]) -> Series:
    """Several series added up at each time any of them has a point."""
    totals: dict[float, float] = {}
    for series in all_series:
        for moment, value in series:
            totals[moment] = totals.get(moment, 0.0) + value
    return tuple(sorted(totals.items()))


def _is_service_name(name: str) -> bool:
    """Is ``name`` one the library accepts for a service (a queue that only looks like an archive is no one's)?"""
    try:
        check_service_name(name)
    except InvalidName:
        return False
    return True


def _rate(stats: Mapping[str, Any], name: str) -> float | None:
    details = stats.get(name)
    return float(details["rate"]) if isinstance(details, Mapping) and "rate" in details else None
