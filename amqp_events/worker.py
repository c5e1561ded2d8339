"""The worker side: Celery's consumer, declaring the topology and archiving what it cannot run.

``events_app`` sets ``worker_consumer`` to :class:`EventConsumer`, so a plain
``celery -A module worker`` uses it. Two things change from Celery's own:

* On every (re)connection the service's topology is declared before any
  queue is consumed. A declaration error stops the worker with a message
  that names the queue, the argument and both values (it is raised from the
  consumer's start-up, where Celery treats it as unrecoverable, not from a
  signal handler, which would only log it).
* A message the worker cannot run is archived with a reason and acked,
  instead of being acked and dropped (Celery's default for undecodable
  messages) or rejected (its default for unknown tasks, which the queue's
  dead-letter exchange would bring straight back).

It also leaves out Celery's native delayed delivery and, with the solo
pool, sends acks at once (see :meth:`EventConsumer.call_soon_ack`).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, ClassVar

from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery import signals
from celery.concurrency.solo import TaskPool as SoloPool
from celery.exceptions import InvalidTaskError
from celery.worker.consumer import Consumer
from celery.worker.request import Request
from celery.worker.state import task_ready
from kombu.exceptions import ContentDisallowed
from kombu.message import Message
from vine import promise

from amqp_events import delays
from amqp_events.declare import TopologyMismatch, declare_topology
from amqp_events.handler import Delivery, EventHandler
from amqp_events.message import Delivered, Failure, Reason, archived_message
from amqp_events.metrics import record_archived
from amqp_events.topology import InvalidName, event_queue_name

if TYPE_CHECKING:
    from amqp_events.app import EventsApp

logger = logging.getLogger("amqp_events")


class EventConsumer(Consumer):
    """Celery's task consumer for an :class:`~amqp_events.app.EventsApp` worker."""

    app: EventsApp
    hub: Any

    class Blueprint(Consumer.Blueprint):
        # Celery's native delayed delivery would declare 28 queues of its own
        # on every vhost with quorum queues and bind ours to them; delays here
        # go through the library's ladder, routed back to one queue only.
        default_steps: ClassVar[list[str]] = [
            *(step for step in Consumer.Blueprint.default_steps if not step.endswith(":DelayedDelivery")),
            "amqp_events.metrics.worker:Heartbeat",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        signals.worker_shutting_down.connect(self._wake_event_loop, weak=False)

    def _wake_event_loop(self, **_: Any) -> None:
        # A warm shutdown only sets a flag that the event loop reads between
        # polls, and a poll can last 10 s. The loop wakes only for callbacks
        # scheduled from another thread, so schedule a no-op from one.
        if self.hub is not None:
            threading.Thread(target=self.hub.call_soon, args=(_nothing,), daemon=True).start()

    def call_soon_ack(self, p: Any, *args: Any, **kwargs: Any) -> Any:
        # Celery queues acks for the event loop's next turn. With the solo pool
        # the task ran inside this turn, and the next one may first sit in
        # poll() for up to 10 s: once the prefetch window is full the broker
        # sends nothing to wake it. The solo pool runs on the loop's thread, so
        # send the ack now (a thread pool must keep the queue).
        if isinstance(self.pool, SoloPool):
            try:
                p(*args, **kwargs)
            except Exception:
                logger.exception("could not ack or reject a message")
            return p
        return super().call_soon_ack(p, *args, **kwargs)

    def connect(self) -> Any:
        connection = super().connect()
        try:
            declare_topology(connection, self.app.topology)
        except TopologyMismatch as exc:
            logger.critical("cannot start service %r: %s", self.app.service, exc)
            raise
        return connection

    def create_task_handler(self, promise: Any = promise) -> Any:
        run = super().create_task_handler(promise)

        def on_task_received(message: Message) -> Any:
            # Celery decodes the body later, in code that crashes the consumer
            # on a body of the wrong shape: check it before handing it over.
            try:
                body = message.decode()
            except ContentDisallowed as exc:
                return self.on_invalid_task(None, message, exc)
            except Exception as exc:
                return self.on_decode_error(message, exc)
            if not _is_task_body(body):
                return self.on_invalid_task(
                    body,
                    message,
                    InvalidTaskError("the body is not a Celery task body [args, kwargs, embed]"),
                )
            return run(message)

        return on_task_received

    # Celery's hooks for messages it cannot run, each turned into an archive entry.

    def on_decode_error(self, message: Message, exc: Exception) -> None:
        self.archive_unrunnable(message, Reason.UNDECODABLE, exc)

    def on_unknown_message(self, body: Any, message: Message) -> None:
        self.archive_unrunnable(message, Reason.UNDECODABLE, InvalidTaskError("no 'task' header: not an event"))

    def on_unknown_task(self, body: Any, message: Message, exc: Exception) -> None:
        name = message.headers.get("task")
        error = LookupError(f"service {self.app.service!r} has no handler for event {name!r}")
        self.archive_unrunnable(message, Reason.UNKNOWN_EVENT, error)

    def on_invalid_task(self, body: Any, message: Message, exc: Exception) -> None:
        reason = Reason.FORBIDDEN_CONTENT_TYPE if isinstance(exc, ContentDisallowed) else Reason.UNDECODABLE
        self.archive_unrunnable(message, reason, exc)

    def archive_unrunnable(self, message: Message, reason: str, exc: Exception) -> None:
        """Archive ``message`` with ``reason``, then ack it (if archiving fails it stays unacked)."""
        info = message.delivery_info or {}
        headers = message.headers if isinstance(message.headers, dict) else {}
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
        delivered = Delivered(
            headers=headers,
            body=body,
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            exchange=info.get("exchange") or "",
            routing_key=info.get("routing_key") or "",
            queue=origin_queue(self.app.service, info.get("exchange") or "", info.get("routing_key") or ""),
        )
        failure = Failure.from_exception(reason, exc)
        try:
            self.app.publish_routed(archived_message(delivered, failure, self.app.service, ""))
        except Exception:
            logger.exception(
                "could not archive a message service %r cannot run (%s); it stays on the broker",
                self.app.service,
                reason,
            )
            return
        message.ack()
        record_archived(self.app.service, str(headers.get("task") or ""), reason)
        logger.error(
            "archived a message service %r cannot run: reason=%s event=%s id=%s routing_key=%s: %s",
            self.app.service,
            reason,
            headers.get("task"),
            headers.get("id"),
            delivered.routing_key,
            failure.exception_message,
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


def _nothing() -> None:
    pass


def _is_task_body(body: Any) -> bool:
    return (
        isinstance(body, (list, tuple))
        and len(body) == 3
        and isinstance(body[0], (list, tuple))
        and isinstance(body[1], dict)
        and (body[2] is None or isinstance(body[2], dict))
    )


class EventRequest(Request):
    """Celery's worker-side request for a handler's message, counting pool processes lost exactly.

    When the pool process running a message dies, Celery requeues the
    message (``task_reject_on_worker_lost``); the broker would then count
    every return alike, also those of messages a dying worker had only
    prefetched. The main process knows which message its lost child was
    running, so it handles that one: run again, or archive after
    ``amqp_events_max_deliveries`` losses, then ack.
    """

    task: EventHandler

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if not (isinstance(exc, WorkerLostError) and self.task.acks_late):
            return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        task_ready(self)
        try:
            self.task.after_worker_lost(Delivery.of(self))
        except Exception:
            logger.exception("could not handle the loss of the process running %s; requeueing it", self.id)
            self.reject(requeue=True)
            return None
        self.acknowledge()
        return None
