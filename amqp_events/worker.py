"""What a worker of an events app does besides running handlers.

* On every (re)connection it declares the service's topology before any
  queue is consumed. A declaration error stops the worker with a message
  that names the queue, the argument and both values (raised from the
  consumer's start-up, where Celery treats it as unrecoverable). A worker
  that ends up consuming none of its service's event queues says so loudly.
* A CloudEvent is read into the library's form first (:func:`admit`).
  A message it cannot run (:func:`cannot_run`: undecodable, not a task
  body, an event this service has no handler for, a forbidden content
  type, an unreadable CloudEvent) is archived with its reason and acked.
  If archiving fails, it tries again on a short schedule, then returns the
  message to its queue: never dropped, never held for good.
* Every ``amqp_events_inbox_prune_interval`` seconds it removes the keys
  older than ``amqp_events_inbox_retention`` from its handlers' inboxes, in
  small batches, in a thread of its own (:class:`InboxPruning`).

Celery calls into this module from the consumer of an events app
(:mod:`amqp_events._celery_compat`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery import bootsteps
from celery.exceptions import InvalidTaskError
from kombu import Connection
from kombu.exceptions import ContentDisallowed
from kombu.message import Message

from amqp_events import cloud_events, delays
from amqp_events.clock import utcnow
from amqp_events.declare import declare_topology
from amqp_events.errors import InvalidName, TopologyMismatch
from amqp_events.message import Reason
from amqp_events.outcome import CannotRun, Delivery, Handling, decide
from amqp_events.settings import longest_life_of_a_duplicate
from amqp_events.settle import describe, settle
from amqp_events.topology import event_queue_name

if TYPE_CHECKING:
    from amqp_events.app import EventsApp

logger = logging.getLogger(__name__)

#: Seconds between attempts to archive a message the worker cannot run; after the last, it goes back to its queue.
ARCHIVE_RETRY_DELAYS = (1.0, 2.0, 4.0)


def on_connected(app: EventsApp, connection: Connection, consumed: Mapping[str, Any]) -> None:
    """Declare the service's topology on a new connection; complain if no event queue is consumed."""
    try:
        declare_topology(connection, app.topology)
    except TopologyMismatch as exc:
        logger.critical("cannot start service %r: %s", app.service, exc)
        raise
    event_queues = {queue.name for queue in app.topology.event_queues}
    if not event_queues & set(consumed):
        logger.error(
            "service %r: this worker consumes none of the service's event queues (%s), so no event reaches it. %s",
            app.service,
            ", ".join(sorted(event_queues)) or "it has no handler",
            "Register handlers in modules the worker imports (the app's imports= or include=, "
            "`celery worker --include`, or app.autodiscover_tasks())"
            if not event_queues
            else "Check the worker's -Q/-X options.",
        )


class Archiver:
    """Archives the messages a worker cannot run, on the consumer's event loop."""

    def __init__(self, app: EventsApp, timer: Any) -> None:
        self.app, self.timer = app, timer

    def archive(self, message: Message, reason: Reason, error: Exception, attempt: int = 0) -> None:
        """Archive ``message`` with ``reason``, then ack it; if that fails, try again later (bounded)."""
        delivery = delivery_of_message(message, self.app.service)
        handling = Handling.from_settings(self.app.events_settings, self.app.service)
        outcome = decide(delivery, CannotRun(reason, error), handling, utcnow())
        try:
            settle(self.app, delivery, outcome, handling, None)
        except Exception as exc:
            self._failed(message, reason, error, attempt, exc)
            return
        message.ack()

    def _failed(self, message: Message, reason: Reason, error: Exception, attempt: int, exc: Exception) -> None:
        about = f"a message service {self.app.service!r} cannot run ({reason}, id {message.headers.get('id')!r})"
        if attempt < len(ARCHIVE_RETRY_DELAYS):
            delay = ARCHIVE_RETRY_DELAYS[attempt]
            logger.warning("could not archive %s: %s; trying again in %gs", about, describe(exc), delay)
            self.timer.call_after(delay, self.archive, (message, reason, error, attempt + 1))
            return
        logger.error("could not archive %s: %s; returning it to its queue", about, describe(exc))
        try:
            message.reject(requeue=True)
        except Exception:  # the channel is gone: the broker has it back already
            logger.warning("could not return %s to its queue; the broker gets it back with the channel", about)


def delivery_of_message(message: Message, service: str) -> Delivery:
    """A raw message, kept byte for byte for the archive."""
    info = message.delivery_info or {}
    headers = message.headers if isinstance(message.headers, dict) else {}
    body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
    exchange, routing_key = info.get("exchange") or "", info.get("routing_key") or ""
    return Delivery(
        headers=headers,
        queue=origin_queue(service, exchange, routing_key),
        exchange=exchange,
        routing_key=routing_key,
        raw_body=body,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
    )


def origin_queue(service: str, exchange: str, routing_key: str) -> str:
    """The queue of ``service`` a message was consumed from, worked out from how it was routed."""
    try:
        if exchange == delays.DELIVERY_EXCHANGE:
            _, destination = delays.decode_routing_key(routing_key)
            kind, _, name = destination.partition(".")
            return name if kind == "queue" else event_queue_name(service, name)
        if exchange == "":
            return routing_key
        return event_queue_name(service, routing_key)
    except (InvalidName, ValueError):
        return ""


def admit(message: Message, app: EventsApp) -> tuple[Reason, Exception] | None:
    """Why a worker of ``app`` cannot run ``message`` (it archives it with that reason), if it cannot.

    A CloudEvent is first read into the library's form, in place
    (:func:`amqp_events.cloud_events.adopt`); one that cannot be read is refused as it arrived.
    """
    unreadable = cloud_events.adopt(message)
    if unreadable is not None:
        return unreadable.reason, unreadable
    return cannot_run(message, app)


def cannot_run(message: Message, app: EventsApp) -> tuple[Reason, Exception] | None:
    """Why a worker of ``app`` cannot run ``message`` at all (it archives it with that reason), if it cannot."""
    try:
        body = message.decode()
    except ContentDisallowed as exc:
        return Reason.FORBIDDEN_CONTENT_TYPE, exc
    except Exception as exc:
        return Reason.UNDECODABLE, exc
    if not is_task_body(body):
        return Reason.UNDECODABLE, InvalidTaskError("the body is not a Celery task body [args, kwargs, embed]")
    name = (message.headers or {}).get("task")
    if not name:
        return Reason.UNDECODABLE, not_an_event()
    if name not in app.tasks:
        return Reason.UNKNOWN_EVENT, unknown_event(app.service, name)
    return None


def not_an_event() -> Exception:
    error: Exception = InvalidTaskError("no 'task' header: not an event")
    return error


def unknown_event(service: str, name: object) -> Exception:
    return LookupError(f"service {service!r} has no handler for event {name!r}")


def is_task_body(body: Any) -> bool:
    """Is ``body`` a Celery protocol-2 task body, ``[args, kwargs, embed]``?"""
    return (
        isinstance(body, (list, tuple))
        and len(body) == 3
        and isinstance(body[0], (list, tuple))
        and isinstance(body[1], dict)
        and (body[2] is None or isinstance(body[2], dict))
    )


class InboxPruning(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer step: prune the inboxes (and SQL dedup stores) of this service's handlers now and then."""

    label = "amqp-events inbox pruning"
    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.timer_entry: Any = None
        self.thread: threading.Thread | None = None

    def start(self, c: Any) -> None:
        stores = {id(store): store for task in c.app.tasks.values() for store in _prunable(task)}
        if not stores or self.timer_entry is not None:
            return
        settings = c.app.events_settings
        if settings.inbox_retention < longest_life_of_a_duplicate(settings):
            logger.warning(
                "amqp_events_inbox_retention (%gs) is shorter than a duplicate may live (%gs: every retry delay, "
                "then the archive's TTL): a late duplicate would run again",
                settings.inbox_retention,
                longest_life_of_a_duplicate(settings),
            )
        self.timer_entry = c.timer.call_repeatedly(
            settings.inbox_prune_interval, self.prune, (list(stores.values()), settings.inbox_retention)
        )

    def stop(self, c: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None

    shutdown = stop

    def prune(self, stores: list[Any], retention: float) -> None:
        """Prune in a thread: the event loop must never wait for a database."""
        if self.thread is not None and self.thread.is_alive():
            return
        self.thread = threading.Thread(target=_prune, args=(stores, retention), daemon=True, name="amqp-events-prune")
        self.thread.start()


def _prunable(task: Any) -> list[Any]:
    return [store for store in (getattr(task, "inbox", None), getattr(task, "dedup", None)) if hasattr(store, "prune")]


def _prune(stores: list[Any], retention: float) -> None:
    for store in stores:
        try:
            pruned = store.prune(time.time() - retention)
        except Exception as exc:
            logger.warning("could not prune an inbox: %s", describe(exc))
        else:
            if pruned:
                logger.info("pruned %d key(s) older than %gs from an inbox", pruned, retention)
