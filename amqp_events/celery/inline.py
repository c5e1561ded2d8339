"""Running one message of a service in the caller's thread, as a ``celery worker`` with the solo pool
would: the consumer's admission (archiving what cannot run), then Celery's ``Request`` of the handler task,
traced by Celery in this thread. The in-process mode of :mod:`amqp_events.testing` runs every message
through here, so that an outcome there is decided by the very code a worker runs.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/test_contract.py runs the same scenarios here and on a broker).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from celery.app.trace import trace_task_ret
from celery.exceptions import Reject
from kombu.message import Message
from kombu.serialization import prepare_accept_content
from kombu.utils.imports import symbol_by_name

from amqp_events.celery import batches, ordered
from amqp_events.celery.received import Archiver, admit
from amqp_events.celery.running import run_here
from amqp_events.core.delivery import Delivery
from amqp_events.core.outcome import Redeliver, SendToArchive
from amqp_events.errors import NotModelled
from amqp_events.ordering.parking import Parking
from amqp_events.wire.batch import is_batch


class InlineWorker:
    """Runs the messages of one service, one at a time, when asked (:meth:`run`)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.hostname = f"in-process@{app.service}"
        self.pool = InlinePool(app)
        self.accept = prepare_accept_content(app.conf.accept_content)
        self.archiver = Archiver(lambda: app.context, timer=NoArchiveRetries())
        self.parking = Parking(lambda: app.context)

    def run(
        self,
        body: bytes,
        headers: dict[str, Any],
        properties: dict[str, Any],
        delivery_info: dict[str, Any],
        channel: Any,
    ) -> None:
        """Run one message as the service's worker would; it ends acked or rejected on ``channel``
        (``basic_ack``/``basic_reject``)."""
        message = Message(
            body=body,
            delivery_tag=delivery_info.get("delivery_tag", 1),
            content_type=properties.get("content_type"),
            content_encoding=properties.get("content_encoding"),
            delivery_info=delivery_info,
            properties=properties,
            headers=headers,
            accept=self.accept,
            channel=channel,
        )
        verdict = admit(message, self.app.context)
        if verdict is not None:
            self.archiver.take(message, verdict)
            return
        task = self.app.tasks[message.headers["task"]]
        if is_batch(message.headers):  # its events come one by one, as a worker of Celery's path takes them
            batches.split(self.app.context, task.handler.queue, message, _ack(message), _reject(message))
            return
        if task.handler.ordered:
            self.run_ordered(task, message, channel)
            return
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

    def run_ordered(self, task: Any, message: Message, channel: Any) -> None:
        """An ordered handler's message, as a worker's :class:`~amqp_events.celery.ordered.OrderedRunner`
        runs it: its retry is held by the broker in memory, the later messages of its key behind it."""
        args, kwargs, _ = message.decode()
        info = message.delivery_info
        delivery = Delivery(message.headers, channel.queue, info["exchange"], info["routing_key"], args, kwargs)

        key = ordered.key_of(self.app, task.handler, message, delivery, _ack(message), _reject(message))
        if key is None:
            return
        partition, parking = channel.queue, self.parking
        action = parking.admit(partition, key, delivery.event_id, message.headers)
        if not ordered.takes_part(action, parking, partition, key, message):
            message.ack()
            return
        try:
            outcome = run_here(self.app, task, delivery, info, self.hostname)
        except Reject as exc:
            message.reject(exc.requeue)
            return
        if isinstance(outcome, Redeliver):  # it comes again, as what it was admitted as
            channel.hold(ordered.keeping_marks(outcome, message.headers))
            return
        parking.ran(partition, key, delivery.event_id, action, isinstance(outcome, SendToArchive), task.handler.parks)
        message.ack()


def _ack(message: Message) -> Callable[..., None]:
    """``message``'s ack, as a worker's strategy calls it (``ack(logger, errors)``)."""
    return lambda *_: message.ack()


def _reject(message: Message) -> Callable[..., None]:
    """``message``'s reject, as a worker's strategy calls it (``reject(logger, errors, requeue)``)."""
    return lambda _, __, requeue: message.reject(requeue)


class InlinePool:
    """Celery's solo pool, for one app of several in a process: traces a request at once, in this thread."""

    def __init__(self, app: Any) -> None:
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
