"""What the console reads and changes on one vhost, through the library's own operations (the same code as the
CLI's ``archive``, ``breakers`` and ``topology`` commands), each change recorded in the event log with who made it.

Pages read the latest reading of the vhost (:mod:`amqp_events.console.watch`), renewed in the background; a
change reads its service's archive again at once, so the page shown after it shows its effect."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from amqp_events.archive import Archive, Selection
from amqp_events.celery import control
from amqp_events.celery.heartbeats import OnlineWorkers, follow
from amqp_events.console.audit import AuditTrail
from amqp_events.console.discovery import ServiceQueues, services_in
from amqp_events.console.index import ArchiveIndex, Snapshot
from amqp_events.console.overview import ServiceRow, by_urgency, service_row
from amqp_events.console.watch import Reading, Watch
from amqp_events.core.arguments import Arguments
from amqp_events.core.versions import UpcastFailed, as_handled, handled_version
from amqp_events.errors import BadArguments, UnknownService
from amqp_events.inbox.prune import prunable_stores
from amqp_events.limits.operations import limits_set, set_row
from amqp_events.limits.overrides import Override
from amqp_events.topology.names import is_partition_queue
from amqp_events.transport.management import ManagementAPI
from amqp_events.wire.archive_entries import ArchivedMessage
from amqp_events.wire.message import EVENT_VERSION

if TYPE_CHECKING:
    from amqp_events.celery import EventsApp

logger = logging.getLogger(__name__)


class Fleet:
    """The services of the vhost of ``app``'s broker, as the management API ``management`` sees them."""

    def __init__(
        self,
        app: EventsApp,
        management: ManagementAPI,
        vhost: str,
        own: bool = False,
        refresh: float = 5.0,
        audit: AuditTrail | None = None,
    ) -> None:
        self.app, self.management, self.vhost = app, management, vhost
        #: ``app`` is a service's own (``-A``): its outbox and inboxes are shown too.
        self.own = own
        #: Seconds between two readings of the vhost (the pages' figures are at most this old).
        self.refresh = refresh
        self.audit = audit or AuditTrail()
        self.index = ArchiveIndex(app.context.transport, identity=app.context.identity)
        self.watch = Watch(management, vhost, self.index, app.context, refresh)
        #: The latest heartbeat of each online worker, by (service, worker), beat by beat once :meth:`listen` runs.
        self.online = OnlineWorkers(app.context.identity, app.events_settings.heartbeat_interval)
        self._stop = threading.Event()

    def listen(self) -> None:
        """Keep :attr:`online` and the reading of the vhost up to date in the background."""
        self.watch.start()

        def forever() -> None:
            while not self._stop.is_set():
                try:
                    follow(self.app, self.online, "console", self._stop)
                except Exception as exc:  # the broker went away: try again a moment later
                    logger.warning("console: listening to heartbeats: %s", exc)
                    self._stop.wait(2)

        threading.Thread(target=forever, daemon=True, name="amqp-events-console-heartbeats").start()

    def stop(self) -> None:
        self._stop.set()
        self.watch.stop()

    def reading(self) -> Reading:
        return self.watch.latest()

    def rows(self) -> list[ServiceRow]:
        """One row per service of the latest reading, those with a problem first."""
        reading = self.reading()
        now = datetime.now(timezone.utc)
        return by_urgency(
            [
                service_row(
                    service,
                    self.index.snapshot(service.name),
                    self.workers(service.name),
                    reading.archive_rate(service.name),
                    reading.replays.get(service.name),
                    reading.unreadable.get(service.name),
                    now,
                )
                for service in reading.services
            ]
        )

    def snapshot(self, service: str) -> Snapshot:
        """``service``'s archive as last read (read now if it never was)."""
        self.service(service)
        return self.index.snapshot(service) or self.index.refresh(service)

    def workers(self, service: str) -> dict[str, dict[str, Any]]:
        """The online workers of ``service`` heard lately, by name: their breakers' and health checks' states."""
        return {worker: beat for (of, worker), beat in sorted(self.online.current().items()) if of == service}

    def services(self, samples_for: int = 0) -> list[ServiceQueues]:
        """The services on the vhost, their archives counted exactly (the management API's figures are up to
        a few seconds old); with ``samples_for`` seconds of samples for the charts."""
        found = services_in(self.management.queues(self.vhost, samples_for))
        return [replace(service, archived=self.app.archive(service.name).count()) for service in found]

    def service(self, name: str) -> ServiceQueues:
        """The service ``name`` as the latest reading found it (or, if it did not, as the management API lists it
        now); :class:`UnknownService` if it has no archive."""
        found = self.reading().service(name)
        if found is None:
            listed = services_in(self.management.queues(self.vhost))
            found = next((service for service in listed if service.name == name), None)
        if found is None:
            raise UnknownService(f"no service {name!r} on this vhost (none has a queue {name}.archive)")
        return found

    def events(self) -> list[dict[str, Any]]:
        """Each event the vhost routes, with the services it reaches (as the latest reading found them); with a
        service's own app (``-A``), the version it fires each of its events at and the version each of its handlers
        takes."""
        reached = self.reading().subscribers
        fired: dict[str, int] = dict(self.app.event_versions) if self.own else {}
        taken: dict[str, int] = {}
        if self.own:
            self.app.loader.import_default_modules()
            for handler in self.app.handlers.values():
                taken[handler.event] = max(taken.get(handler.event, 1), handled_version(handler))
        return [
            {
                "event": event,
                "subscribers": reached.get(event, []),
                "fired": fired.get(event),
                "taken": taken.get(event),
            }
            for event in sorted({*reached, *fired, *taken})
        ]

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

    def limits(self, service: str) -> dict[str, Override]:
        """The limits set at run time in ``service`` (``ValueError``: its table cannot be read)."""
        self.service(service)
        return limits_set(self.app.context.transport, service)

    def set_limits(self, service: str, task: str, row: Override | None, by: str) -> dict[str, Override]:
        """Set (or, ``None``, remove) the limits in force of ``service``'s handler ``task`` in every worker, as
        ``amqp-events limits set`` does; :class:`LookupError` if the service has no handler queue of that name."""
        found = self.service(service)
        tasks = {queue.name.partition(":")[2] for queue in found.queues if queue.name.startswith(f"{service}:")}
        if tasks and task not in tasks:
            raise LookupError(f"{service!r} has no handler {task!r} (its handlers: {', '.join(sorted(tasks))})")
        table = set_row(self.app.context.transport, service, task, row)
        detail = {"limits": row.describe()} if row is not None else {}
        self.audit.record(by, "set limits" if row is not None else "reset limits", service, f"handler {task}", **detail)
        return table

    def archive(self, service: str) -> Archive:
        self.service(service)
        return self.app.archive(service)

    def archived(self, service: str, selection: Selection) -> list[ArchivedMessage]:
        return self.archive(service).list(selection)

    def replay(self, service: str, selection: Selection, by: str, target: str = "") -> dict[str, list[str]]:
        report = self.archive(service).replay(selection, replayed_by=by)
        self._changed(by, "replay", service, target or f"{len(report.replayed)} message(s)", ids=report.replayed)
        return {"replayed": report.replayed, "unroutable": report.unroutable}

    def purge(self, service: str, selection: Selection, by: str, target: str = "") -> list[str]:
        purged = self.archive(service).purge(selection)
        self._changed(by, "purge", service, target or f"{len(purged)} message(s)", ids=purged)
        return purged

    def retry_edited(self, service: str, message_id: str, args: list[Any], kwargs: dict[str, Any], by: str) -> bool:
        """Replay archived message ``message_id`` with ``args`` and ``kwargs`` instead of its own, once they fit
        its handler (:class:`BadArguments` if not); False when there is no such message."""
        archive = self.archive(service)
        original = archive.get(message_id)
        if original is None:
            return False
        fired_at = original.headers.get(EVENT_VERSION)
        version = fired_at if type(fired_at) is int and fired_at >= 1 else 1  # else its replay is refused as ever
        self.fits(service, original.handler, original.arguments, args, kwargs, version)
        if archive.retry_edited(message_id, args, kwargs, replayed_by=by) is None:
            return False  # replayed or purged by someone else meanwhile
        before = dict(zip(("args", "kwargs"), original.arguments or ([], {}), strict=True))
        self._changed(
            by, "edit", service, f"message {message_id}", before=before, after={"args": args, "kwargs": kwargs}
        )
        return True

    def fits(
        self,
        service: str,
        handler_name: str,
        original: tuple[list[Any], dict[str, Any]] | None,
        args: list[Any],
        kwargs: dict[str, Any],
        version: int = 1,
    ) -> None:
        """Refuse (:class:`BadArguments`) arguments the handler cannot take: checked against its signature when
        the console runs with the service's app (``-A``), as a worker hands them to it (those of an event fired at
        another ``version`` upcast or trimmed first), else against the original's (same names, same count)."""
        handler = self._own_handler(service, handler_name)
        if handler is not None:
            try:
                kwargs = as_handled(handler, version, kwargs)
            except UpcastFailed as exc:
                raise BadArguments(str(exc)) from None
            args_t = tuple(args)
            handler.fit(args_t, kwargs)
            if handler.event_class is None and not handler.leading_parameters:
                arguments = Arguments(handler.signature)
                named = arguments.by_name(args_t, kwargs)
                try:
                    arguments.check(handler.event, named or {})
                except TypeError as exc:
                    raise BadArguments(str(exc)) from None
            return
        if original is None:
            raise BadArguments("its body is not an event's arguments: it cannot be edited")
        if len(args) != len(original[0]) or set(kwargs) != set(original[1]):
            raise BadArguments(
                f"without the service's app (amqp-events -A ... console) the console knows {handler_name}'s "
                f"arguments only from the archived message: keep {len(original[0])} positional and the names "
                f"{sorted(original[1])}, change only their values"
            )

    def _own_handler(self, service: str, handler_name: str) -> Any:
        if not self.own or self.app.service != service:
            return None
        self.app.loader.import_default_modules()
        return next((handler for handler in self.app.handlers.values() if handler.name == handler_name), None)

    def steer(self, service: str, handler: str, action: str, by: str, wait: float = 10.0) -> dict[str, list[str]]:
        """Pause (``open``) or resume (``close``) ``handler`` in every live worker of ``service``; the handlers
        each worker matched, by worker. The answers are awaited until each worker online has given its own (a busy
        worker may take seconds), ``wait`` seconds at most."""
        self.service(service)
        matched = control.steer(self.app, service, handler, action, wait, expected=len(self.workers(service)))
        verb = "pause" if action == "open" else "resume"
        self.audit.record(by, verb, service, f"handler {handler}", workers=sorted(matched))
        return matched

    def _changed(self, by: str, action: str, service: str, target: str, **detail: Any) -> None:
        self.audit.record(by, action, service, target, **detail)
        self.index.refresh(service)  # the next page shows the change
