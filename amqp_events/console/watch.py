"""The console's reading of its vhost, renewed in the background every few seconds: pages answer from the latest
reading (and say when it was made) instead of asking the broker while an operator waits.

A reading is one listing of the vhost's queues from the management API (with
an hour of samples for the charts, once a minute: the broker samples no more
often), the cluster's nodes, the record of each service's latest history
replay, and every archive's snapshot, each archive browsed again only when it
changed (:class:`~amqp_events.console.index.ArchiveIndex`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from amqp_events.console.discovery import ServiceQueues, services_in, subscribers
from amqp_events.console.index import ArchiveIndex
from amqp_events.core.context import ServiceContext
from amqp_events.errors import ManagementError
from amqp_events.history.replay import Cursor, read_cursor
from amqp_events.topology import archive_queue_name
from amqp_events.topology.names import HISTORY_STREAM, history_cursor_queue_name, is_delay_queue
from amqp_events.transport.management import ManagementAPI

logger = logging.getLogger(__name__)
#: The span of the charts' samples, and how often they are read again (seconds).
CHART_SPAN, SAMPLES_EVERY = 3600, 60.0
#: Seconds beyond which a reading of the vhost is logged as slow.
SLOW_READING = 5.0


@dataclass(frozen=True)
class Reading:
    """The vhost as read at ``at``."""

    at: datetime
    services: tuple[ServiceQueues, ...]
    #: The management API's record of each queue, by name.
    queues: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    nodes: tuple[Mapping[str, Any], ...] = ()
    #: Retries and delayed events waiting on the delay ladder (every service's: the ladder is shared).
    delayed: int = 0
    #: The record of each service's latest history replay, by service (those that had one).
    replays: Mapping[str, Cursor] = field(default_factory=dict)
    #: When the charts' samples were read (they are kept between two such readings).
    sampled_at: float = 0.0
    #: Why an archive could not be read, by service (its figures are the last ones read, if any).
    unreadable: Mapping[str, str] = field(default_factory=dict)
    #: The services each event reaches, by event (:func:`~amqp_events.console.discovery.subscribers`).
    subscribers: Mapping[str, list[str]] = field(default_factory=dict)

    def service(self, name: str) -> ServiceQueues | None:
        return next((service for service in self.services if service.name == name), None)

    @property
    def history(self) -> Mapping[str, Any] | None:
        return self.queues.get(HISTORY_STREAM)

    @property
    def broker_started(self) -> float | None:
        """When the broker's longest-running node started (seconds since the epoch), as its uptime says: the
        management API's samples before then are zeros it never counted. ``None``: its nodes are not known."""
        uptimes = [float(node["uptime"]) for node in self.nodes if isinstance(node.get("uptime"), int | float)]
        return self.at.timestamp() - max(uptimes) / 1000 if uptimes else None

    def archive_rate(self, service: str) -> float | None:
        """Messages per second archived by ``service`` lately (the broker's rate of publishes into its archive)."""
        stats = self.queues.get(archive_queue_name(service), {}).get("message_stats") or {}
        details = stats.get("publish_details")
        return float(details["rate"]) if isinstance(details, Mapping) and "rate" in details else None


def read(
    management: ManagementAPI, vhost: str, index: ArchiveIndex, context: ServiceContext, before: Reading | None = None
) -> Reading:
    """Read the vhost now (each archive only if it changed since its last reading; the charts' samples only if
    those of ``before`` are a minute old)."""
    started = time.monotonic()
    sampling = before is None or started - before.sampled_at >= SAMPLES_EVERY
    listing = management.queues(vhost, CHART_SPAN if sampling else 0)
    listed = time.monotonic()
    queues = {str(item["name"]): item for item in listing}
    services = services_in(listing)
    if not sampling and before is not None:
        services = [_with_samples_of(service, before.service(service.name)) for service in services]
    unreadable = {}
    for service in services:
        item = queues[archive_queue_name(service.name)]
        stats = item.get("message_stats") or {}
        try:
            exact = index.transport.count(archive_queue_name(service.name))
            index.refresh(service.name, (exact, stats.get("publish"), stats.get("ack")))
        except Exception as exc:  # another service's archive, under a service's own user: the others are read
            unreadable[service.name] = f"{type(exc).__name__}: {exc}"
    index.forget({service.name for service in services})
    counted = time.monotonic()
    try:
        nodes: tuple[Mapping[str, Any], ...] = tuple(management.nodes())
    except ManagementError:  # a user without the monitoring tag may not list nodes
        nodes = ()
    try:
        reached = subscribers(management.bindings(vhost), context.settings.exchange)
    except ManagementError:  # the events table then lists what the app knows of
        reached = {}
    delayed = sum(int(item.get("messages") or 0) for name, item in queues.items() if is_delay_queue(name))
    replays = {
        service.name: cursor
        for service in services
        if int(queues.get(history_cursor_queue_name(service.name), {}).get("messages") or 0)
        and (cursor := read_cursor(context, service.name)) is not None
    }
    sampled_at = time.monotonic() if sampling or before is None else before.sampled_at
    moment = datetime.now(timezone.utc)
    if (took := time.monotonic() - started) > SLOW_READING:  # the pages show figures that old, or older
        logger.warning(
            "console: reading the vhost took %.1f s (its queues listed in %.1f s, archives %.1f s, the rest %.1f s)",
            took, listed - started, counted - listed, took - (counted - started),
        )  # fmt: skip
    return Reading(moment, tuple(services), queues, nodes, delayed, replays, sampled_at, unreadable, reached)


def _with_samples_of(service: ServiceQueues, before: ServiceQueues | None) -> ServiceQueues:
    if before is None:
        return service
    return replace(service, archived_over_time=before.archived_over_time, handled_over_time=before.handled_over_time)


class Watch:
    """Reads the vhost every ``interval`` seconds in a thread of its own; :meth:`latest` is the last reading."""

    def __init__(
        self, management: ManagementAPI, vhost: str, index: ArchiveIndex, context: ServiceContext, interval: float
    ) -> None:
        self.management, self.vhost, self.index, self.interval = management, vhost, index, interval
        self.context = context
        self._latest: Reading | None = None
        self._failure: Exception | None = None
        self._read = threading.Event()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._started = False

    def start(self) -> None:
        self._started = True
        threading.Thread(target=self._forever, daemon=True, name="amqp-events-console-watch").start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def read_now(self) -> Reading:
        """Read again at once (after an operator's change), in the caller's thread."""
        reading = read(self.management, self.vhost, self.index, self.context, self._latest)
        self._latest, self._failure = reading, None
        self._read.set()
        return reading

    def latest(self, timeout: float = 30.0) -> Reading:
        """The last reading; the first one is waited for (its failure raised, as the broker being unreachable).
        Without :meth:`start`, a reading made now."""
        if not self._started:
            return self.read_now()
        if self._latest is None:
            self._wake.set()
            self._read.wait(timeout)
        if self._latest is None:
            raise self._failure or ManagementError("the console has not read the broker yet: try again")
        return self._latest

    @property
    def failure(self) -> Exception | None:
        """Why the last attempt to read failed (``None``: it did not)."""
        return self._failure

    def _forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.read_now()
            except Exception as exc:  # the broker went away: the pages keep the last reading and say so
                logger.warning("console: reading the vhost: %s: %s", type(exc).__name__, exc)
                self._failure = exc
                self._read.set()
            self._wake.wait(self.interval)
            self._wake.clear()
