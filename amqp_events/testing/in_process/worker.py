"""A service's worker in the test's own thread: each message goes through Celery's own request and trace.

For every message the in-process mode delivers, :class:`InProcessWorker`
does what a ``celery worker`` of the service with the solo pool does: the
consumer's checks (:func:`amqp_events.worker.admit`, archiving what
cannot run), then Celery's ``Request`` of the handler task, traced by
Celery in this thread, which acks or rejects the message on the in-memory
broker. So a handler's outcome is decided by the very code a worker runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from celery.app.trace import trace_task_ret
from kombu.message import Message
from kombu.serialization import prepare_accept_content
from kombu.utils.imports import symbol_by_name

from amqp_events.app import EventsApp
from amqp_events.handler import EventHandler
from amqp_events.metrics import HandlerMetrics
from amqp_events.testing.in_process.memory import Envelope, MemoryBroker
from amqp_events.worker import Archiver, admit


class NotModelled(Exception):
    """The test relies on something the in-process mode does not model: test it against a real broker."""


class InProcessWorker:
    """Runs the messages of one service's queues, one at a time, when asked."""

    def __init__(self, app: EventsApp, broker: MemoryBroker) -> None:
        self.app, self.broker = app, broker
        self.hostname = f"in-process@{app.service}"
        self.pool = InlinePool(app)
        self.accept = prepare_accept_content(app.conf.accept_content)
        self.archiver = Archiver(app, timer=NoArchiveRetries())

    def consume(self, queue: str, envelope: Envelope) -> None:
        """Run ``envelope``, taken off ``queue``, as the service's worker would; it ends acked or rejected."""
        channel = MemoryChannel(self.broker, queue, envelope)
        message = Message(
            body=envelope.body,
            delivery_tag=envelope.seq,
            content_type=envelope.content_type,
            content_encoding=envelope.content_encoding,
            delivery_info={
                "exchange": envelope.exchange,
                "routing_key": envelope.routing_key,
                "redelivered": envelope.redelivered,
            },
            properties=envelope.properties,
            headers=envelope.headers,
            accept=self.accept,
            channel=channel,
        )
        refused = admit(message, self.app)
        if refused is not None:
            self.archiver.archive(message, *refused)
        else:
            task = self.app.tasks[message.headers["task"]]
            request = symbol_by_name(task.Request)(
                message,
                on_ack=message.ack_log_error,
                on_reject=message.reject_log_error,
                app=self.app,
                hostname=self.hostname,
                task=task,
                connection_errors=(),
                body=message.body,
                headers=message.headers,
                decoded=False,
            )
            request.execute_using_pool(self.pool)
        if not channel.settled:
            raise RuntimeError(f"the worker of {self.app.service!r} neither acked nor rejected {message.headers}")

    def record_metrics(self, on: bool) -> None:
        """Record handler metrics as a worker serving them does (``on``), or as before."""
        settings = self.app.events_settings
        for task in self.app.tasks.values():
            if not isinstance(task, EventHandler):
                continue
            if on:  # EventHandler.metrics is a cached property: set it, or drop it to compute it again
                labels = settings.metrics_exception_labels
                task.__dict__["metrics"] = HandlerMetrics(self.app.service, task.handler_name, labels, True)
            else:
                task.__dict__.pop("metrics", None)


class MemoryChannel:
    """Where a consumed message's ack or reject goes: the in-memory queue it came from."""

    no_ack_consumers = None

    def __init__(self, broker: MemoryBroker, queue: str, envelope: Envelope) -> None:
        self.broker, self.queue, self.envelope = broker, queue, envelope
        self.settled = False

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.settled = True

    def basic_reject(self, delivery_tag: int, requeue: bool) -> None:
        self.broker.reject(self.queue, self.envelope, requeue)
        self.settled = True


class InlinePool:
    """Celery's solo pool, for one app of several in a process: traces a request at once, in this thread."""

    def __init__(self, app: EventsApp) -> None:
        self.app = app

    def apply_async(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] = (),
        accept_callback: Callable[..., Any] | None = None,
        callback: Callable[[Any], Any] | None = None,
        **_: Any,
    ) -> None:
        if accept_callback is not None:
            accept_callback(os.getpid(), time.monotonic())
        try:
            # Celery's trace, given this app: the process's current app may be another service's.
            result = trace_task_ret(*args, app=self.app)
        except Exception:
            raise
        except BaseException as exc:
            raise NotModelled(
                f"a handler of {self.app.service!r} ended its process ({exc!r}): the in-process mode does not "
                "model lost worker processes; test that with real workers (amqp_events.testing.fixtures)"
            ) from exc
        if callback is not None:
            callback(result)


class NoArchiveRetries:
    """The archiver's timer: on a real worker, archiving is tried again later; here it cannot fail but by a bug."""

    def call_after(self, delay: float, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        raise NotModelled("archiving a message failed (see the warning logged just before)")
