"""``amqp-events exporter``: broker-side metrics of a service, for Prometheus.

A background thread collects, every ``interval`` seconds, the ready and
unacknowledged messages and the consumers of every queue in the service's
topology (from the management API, or from passive declares when it cannot
be reached: ready messages and consumers only). Another thread listens to the
workers' heartbeats. A scrape only reads the latest snapshot: it never waits
for the broker.

With a history on the vhost (``amqp_events_history``), it also tells how
many events the history keeps, the age of the oldest, its retention by age,
and how old the event is that an unfinished replay into the service goes on
from (an alert compares the last two).

Workers are up while their heartbeats keep coming; one silent for
``worker_timeout`` seconds (killed, say) reads 0, and its series is dropped
after ``forget_after`` seconds, while ``amqp_events_workers_online`` stays
present for every service seen, at 0 when none is left.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from amqp_events.celery.heartbeats import heard
from amqp_events.errors import ManagementError
from amqp_events.history.watch import HistoryWatch, watch
from amqp_events.topology import sizing
from amqp_events.topology.layout import heartbeats_listener
from amqp_events.topology.names import HISTORY_STREAM, queue_kind
from amqp_events.transport.management import ManagementAPI

if TYPE_CHECKING:
    from amqp_events.celery import EventsApp

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueStats:
    name: str
    kind: str
    ready: float
    unacked: float | None  # unknown without the management API
    consumers: float
    max_length: float | None


@dataclass
class WorkerStates:
    """Heartbeats turned into up/down per worker (pure: time is passed in)."""

    timeout: float
    forget_after: float
    last_seen: dict[tuple[str, str], float] = field(default_factory=dict)
    offline: set[tuple[str, str]] = field(default_factory=set)
    services: set[str] = field(default_factory=set)

    def heard(self, service: str, worker: str, state: str, now: float) -> None:
        key = (service, worker)
        self.services.add(service)
        self.last_seen[key] = now
        if state == "offline":
            self.offline.add(key)
        else:
            self.offline.discard(key)

    def snapshot(self, now: float) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
        """``({(service, worker): up}, {service: workers online})``; forgets long-silent workers."""
        for key, seen in list(self.last_seen.items()):
            if now - seen > self.forget_after:
                del self.last_seen[key]
                self.offline.discard(key)
        up = {key: int(now - seen <= self.timeout and key not in self.offline) for key, seen in self.last_seen.items()}
        online = dict.fromkeys(self.services, 0)
        for (service, _), value in up.items():
            online[service] += value
        return up, online


class Exporter:
    """Collects a service's broker-side metrics in the background and serves them."""

    def __init__(
        self,
        app: EventsApp,
        management: ManagementAPI | None,
        interval: float = 15.0,
        worker_timeout: float = 30.0,
        forget_after: float = 600.0,
    ) -> None:
        self.app, self.management, self.interval = app, management, interval
        self.topology = app.topology
        self.vhost = app.rabbitmq.vhost
        self.workers = WorkerStates(worker_timeout, forget_after, services={app.service})
        self.queues: list[QueueStats] = []
        self.history: HistoryWatch | None = None
        #: Quorum queues on the vhost (management API), and where the exporter warns (the service's setting).
        self.quorum_queues: int | None = None
        self.quorum_queue_warning = app.events_settings.quorum_queue_warning
        self.errors = 0
        self.last_collection = 0.0
        self.last_duration = 0.0
        self.last_heartbeat = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    # -- background work ----------------------------------------------------

    def start(self) -> None:
        self.collect_once()
        for target in (self._collect_forever, self._listen_forever):
            threading.Thread(target=target, daemon=True, name=f"amqp-events-{target.__name__}").start()

    def stop(self) -> None:
        self._stop.set()

    def collect_once(self) -> None:
        started = time.monotonic()
        try:
            listing = self._listing()
            queues = self._from_declares() if listing is None else self._from_management(listing)
            stream = None if listing is None else listing.get(HISTORY_STREAM)
            history = watch(self.app.history(), stream, datetime.now(timezone.utc))
            held = None if listing is None else sizing.quorum_queues(listing.values())
        except Exception as exc:
            with self._lock:
                self.errors += 1
            logger.warning("collection failed: %s", exc)
            return
        warn_at = self.quorum_queue_warning
        if held is not None and warn_at and held > warn_at >= (self.quorum_queues or 0):  # once, as it passes
            logger.warning(
                "vhost %s holds %s quorum queues, more than amqp_events_quorum_queue_warning (%s): %s",
                self.vhost, f"{held:,}", f"{warn_at:,}", sizing.cost(held),
            )  # fmt: skip
        with self._lock:
            self.queues, self.history, self.quorum_queues = queues, history, held
            self.last_duration = time.monotonic() - started
            self.last_collection = time.time()

    def _collect_forever(self) -> None:
        while not self._stop.wait(self.interval):
            self.collect_once()

    def _listing(self) -> dict[str, dict[str, Any]] | None:
        """The management API's record of every queue of the vhost, by name; ``None`` if it cannot be read."""
        if self.management is None:
            return None
        try:
            return {item["name"]: item for item in self.management.queues(self.vhost)}
        except ManagementError:
            logger.warning("management API unavailable: ready messages and consumers only, from passive declares")
            return None

    def _from_management(self, live: dict[str, dict[str, Any]]) -> list[QueueStats]:
        found = []
        for queue in self.topology.queues:
            item = live.get(queue.name)
            if item is not None:
                found.append(
                    QueueStats(
                        queue.name,
                        queue_kind(queue.name, self.topology.service),
                        item.get("messages_ready", 0),
                        item.get("messages_unacknowledged", 0),
                        item.get("consumers", 0),
                        _max_length(queue),
                    )
                )
        return found

    def _from_declares(self) -> list[QueueStats]:
        """Ready messages and consumers by passive declares. Only a 404 means a queue is missing; any other
        error fails the whole collection, so that it is counted and the last snapshot stays."""
        states = self.app.rabbitmq.queue_states(queue.name for queue in self.topology.queues)
        return [
            QueueStats(
                queue.name, queue_kind(queue.name, self.topology.service), ready, None, consumers, _max_length(queue)
            )
            for queue in self.topology.queues
            if queue.name in states
            for ready, consumers in [states[queue.name]]
        ]

    def _listen_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception as exc:
                with self._lock:
                    self.errors += 1
                logger.warning("heartbeat listener: %s; reconnecting", exc)
                self._stop.wait(2)

    def _listen(self) -> None:
        queue = heartbeats_listener(self.app.service, "exporter", self.app.events_settings)
        self.app.rabbitmq.listen(queue, self._on_heartbeat, stop=self._stop)

    def _on_heartbeat(self, body: Any, properties: Mapping[str, Any]) -> None:
        beat = heard(body, properties, self.app.context.identity)
        if beat is not None:
            with self._lock:
                self.workers.heard(beat["service"], beat["worker"], beat["state"], time.time())
                self.last_heartbeat = time.time()

    # -- what a scrape sees ---------------------------------------------------

    def collect(self) -> Iterator[Any]:
        """The prometheus_client collector protocol: yields metric families from the latest snapshot."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            queues, history, quorum_queues = list(self.queues), self.history, self.quorum_queues
            up, online = self.workers.snapshot(time.time())
            errors, last, duration, heartbeat = (
                self.errors,
                self.last_collection,
                self.last_duration,
                self.last_heartbeat,
            )
        labels = ["service", "queue", "kind"]
        ready = GaugeMetricFamily("amqp_events_queue_messages_ready", "Messages ready in the queue.", labels=labels)
        unacked = GaugeMetricFamily(
            "amqp_events_queue_messages_unacked", "Messages delivered, not yet acked.", labels=labels
        )
        consumers = GaugeMetricFamily("amqp_events_queue_consumers", "Consumers of the queue.", labels=labels)
        limit = GaugeMetricFamily("amqp_events_queue_max_length", "The queue's x-max-length.", labels=labels)
        for stats in queues:
            values = [self.app.service, stats.name, stats.kind]
            ready.add_metric(values, stats.ready)
            consumers.add_metric(values, stats.consumers)
            if stats.unacked is not None:
                unacked.add_metric(values, stats.unacked)
            if stats.max_length is not None:
                limit.add_metric(values, stats.max_length)
        yield from (ready, unacked, consumers, limit)
        yield from _history_metrics(self.app.service, history)
        if quorum_queues is not None:
            yield GaugeMetricFamily(
                "amqp_events_vhost_quorum_queues", "Quorum queues on the vhost (management API).", value=quorum_queues
            )
        yield GaugeMetricFamily(
            "amqp_events_quorum_queue_warning",
            "Quorum queues on the vhost beyond which to review the topology (the setting; 0: none).",
            value=self.quorum_queue_warning,
        )
        worker_up = GaugeMetricFamily(
            "amqp_events_worker_up", "1 while the worker's heartbeats arrive.", labels=["service", "worker"]
        )
        for (service, worker), value in sorted(up.items()):
            worker_up.add_metric([service, worker], value)
        yield worker_up
        workers_online = GaugeMetricFamily(
            "amqp_events_workers_online", "Workers of the service whose heartbeats arrive.", labels=["service"]
        )
        for service, value in sorted(online.items()):
            workers_online.add_metric([service], value)
        yield workers_online
        yield GaugeMetricFamily(
            "amqp_events_exporter_last_heartbeat_timestamp_seconds", "When the last heartbeat arrived.", value=heartbeat
        )
        yield GaugeMetricFamily(
            "amqp_events_exporter_last_collection_timestamp_seconds",
            "When the queues were last collected.",
            value=last,
        )
        yield GaugeMetricFamily(
            "amqp_events_exporter_collection_duration_seconds", "How long the last collection took.", value=duration
        )
        yield CounterMetricFamily(
            "amqp_events_exporter_collection_errors", "Failed collections and heartbeat listens.", value=errors
        )

    def serve(self, host: str, port: int) -> Any:
        """Start collecting and serve ``/metrics``; returns the HTTP server."""
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry()
        registry.register(self)
        self.start()
        server, _ = start_http_server(port, host, registry=registry)
        return server


def _history_metrics(service: str, history: HistoryWatch | None) -> Iterator[Any]:
    from prometheus_client.core import GaugeMetricFamily

    families = {
        "events": GaugeMetricFamily("amqp_events_history_events", "Events the history keeps (management API)."),
        "oldest_age": GaugeMetricFamily(
            "amqp_events_history_oldest_event_age_seconds", "Age of the oldest event the history keeps."
        ),
        "max_age": GaugeMetricFamily("amqp_events_history_max_age_seconds", "The history's retention by age."),
    }
    position = GaugeMetricFamily(
        "amqp_events_history_replay_position_age_seconds",
        "Age of the event an unfinished replay into the service goes on from.",
        labels=["service"],
    )
    if history is not None:
        for name, family in families.items():
            value = getattr(history, name)
            if value is not None:
                family.add_metric([], value)
        if history.replay_position_age is not None:
            position.add_metric([service], history.replay_position_age)
    yield from (*families.values(), position)


def _max_length(queue: Any) -> float | None:
    """A topology queue's length bound (its ``x-max-length``), if it has one."""
    value = (getattr(queue, "queue_arguments", None) or {}).get("x-max-length")
    return float(value) if value else None
