"""What the console reads and changes on one vhost, through the library's own operations (the same code as the
CLI's ``archive``, ``breakers`` and ``topology`` commands), each change logged with who made it."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from amqp_events.archive import Archive, Selection
from amqp_events.celery import control
from amqp_events.celery.heartbeats import Beats, listen
from amqp_events.console.discovery import ServiceQueues, services_in
from amqp_events.errors import UnknownService
from amqp_events.inbox.prune import prunable_stores
from amqp_events.topology.names import HISTORY_STREAM, is_partition_queue
from amqp_events.transport.management import ManagementAPI
from amqp_events.wire.archived import ArchivedMessage

if TYPE_CHECKING:
    from amqp_events.celery import EventsApp

logger = logging.getLogger(__name__)
#: Every change made through the console: who, what, on which service (the audit trail).
audit = logging.getLogger("amqp_events.console.audit")


class Fleet:
    """The services of the vhost of ``app``'s broker, as the management API ``management`` sees them."""

    def __init__(self, app: EventsApp, management: ManagementAPI, vhost: str, own: bool = False) -> None:
        self.app, self.management, self.vhost = app, management, vhost
        #: ``app`` is a service's own (``-A``): its outbox and inboxes are shown too.
        self.own = own
        #: The latest heartbeat of each online worker, by (service, worker), once :meth:`listen` runs.
        self.beats: Beats = {}
        self._stop = threading.Event()

    def listen(self) -> None:
        """Keep :attr:`beats` up to date in the background (one heartbeat interval at a time)."""

        def forever() -> None:
            while not self._stop.is_set():
                try:
                    self.beats = listen(self.app, self.app.events_settings.heartbeat_interval * 2, "console")
                except Exception as exc:  # the broker went away: try again a moment later
                    logger.warning("console: listening to heartbeats: %s", exc)
                    self._stop.wait(2)

        threading.Thread(target=forever, daemon=True, name="amqp-events-console-heartbeats").start()

    def stop(self) -> None:
        self._stop.set()

    def workers(self, service: str) -> dict[str, dict[str, Any]]:
        """The online workers of ``service`` heard lately, by name: their breakers' and health checks' states."""
        return {worker: beat for (of, worker), beat in sorted(self.beats.items()) if of == service}

    def services(self, samples_for: int = 0) -> list[ServiceQueues]:
        """The services on the vhost, their archives counted exactly (the management API's figures are up to
        a few seconds old); with ``samples_for`` seconds of samples for the charts."""
        found = services_in(self.management.queues(self.vhost, samples_for))
        return [replace(service, archived=self.app.archive(service.name).count()) for service in found]

    def service(self, name: str) -> ServiceQueues:
        """The service ``name`` as the management API lists it (its archive not counted: only :meth:`services`
        counts, for the overview)."""
        listed = services_in(self.management.queues(self.vhost))
        found = next((service for service in listed if service.name == name), None)
        if found is None:
            raise UnknownService(f"no service {name!r} on this vhost (none has a queue {name}.archive)")
        return found

    def history(self) -> dict[str, Any] | None:
        """The management API's record of the vhost's history stream, if there is one."""
        return next((item for item in self.management.queues(self.vhost) if item["name"] == HISTORY_STREAM), None)

    def databases(self) -> dict[str, Any] | None:
        """The ``-A`` app's outbox (when ``amqp_events_outbox_url`` names it) and its handlers' inboxes: what
        ``outbox status`` and the inbox tables say; ``None`` without an app of a service's own."""
        if not self.own:
            return None
        self.app.loader.import_default_modules()
        found: dict[str, Any] = {"service": self.app.service, "outbox": None, "inboxes": []}
        if self.app.events_settings.outbox_url:
            store, now = self.app.outbox_store(None), time.time()
            stats = store.stats()
            found["outbox"] = {
                "pending": stats.pending,
                "oldest_pending_age_seconds": round(stats.oldest_age(now), 1),
                "dead": stats.dead,
                "relays": [name for name, _, _ in store.relays_seen_since(now - 30)],
            }
        tables = {
            (inbox.engine.url.render_as_string(hide_password=True), inbox.table.name): inbox
            for inbox in prunable_stores(self.app.handlers.values())
            if hasattr(inbox, "size")
        }  # several handlers share a table
        found["inboxes"] = [
            {"database": database, "table": table, "size": inbox.size()}
            for (database, table), inbox in sorted(tables.items())
        ]
        return found

    def parked(self, service: str) -> list[dict[str, Any]]:
        """The keys of ``service``'s ordered handlers parked behind an archived event (or a history replay's
        gate: the key ``""``), with how many events wait behind each, as the workers consuming them answer
        within a second (asked only of a service with partitions)."""
        if not any(is_partition_queue(queue.name, service) for queue in self.service(service).queues):
            return []
        return [
            {"key": key, "partition": partition, "head": sequence["head"], "waiting": sequence["waiting"]}
            for partition, keys in sorted(control.parked(self.app, service, wait=1.0).items())
            for key, sequence in sorted(keys.items())
        ]

    def archive(self, service: str) -> Archive:
        self.service(service)
        return self.app.archive(service)

    def archived(self, service: str, selection: Selection) -> list[ArchivedMessage]:
        return self.archive(service).list(selection)

    def replay(self, service: str, selection: Selection, by: str) -> dict[str, list[str]]:
        report = self.archive(service).replay(selection, replayed_by=by)
        audit.warning("%s replayed %d message(s) of %s: %s", by, len(report.replayed), service, report.replayed)
        return {"replayed": report.replayed, "unroutable": report.unroutable}

    def purge(self, service: str, selection: Selection, by: str) -> list[str]:
        purged = self.archive(service).purge(selection)
        audit.warning("%s purged %d message(s) of %s: %s", by, len(purged), service, purged)
        return purged

    def steer(self, service: str, handler: str, action: str, by: str, wait: float = 3.0) -> dict[str, list[str]]:
        """Pause (``open``) or resume (``close``) ``handler`` in every live worker of ``service``; the handlers
        each worker matched, by worker."""
        self.service(service)
        matched = control.steer(self.app, service, handler, action, wait)
        audit.warning("%s: breaker %s of %s.%s on %s", by, action, service, handler, sorted(matched) or "no worker")
        return matched
