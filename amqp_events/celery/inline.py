"""Running one message of a service in the caller's thread, as a ``celery worker`` with the solo pool
would: the consumer's admission (archiving what cannot run), then the handler task's strategy: the pipeline
on the message itself (:func:`amqp_events.celery.strategy.handler_of`), an ordered handler's through its
runner, and Celery's ``Request``, traced in this thread, where something configured needs Celery's own path
(:func:`~amqp_events.celery.strategy.needs_celery_request`). The in-process mode of
:mod:`amqp_events.testing` runs every message through here, so that an outcome there is decided by the very
code a worker runs.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/broker/test_contract.py runs the same scenarios here and on a broker).
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

from amqp_events.celery import batches, ordered
from amqp_events.celery.received import Archiver, admit
from amqp_events.celery.strategy import handler_of, may_bypass_celery_request, needs_celery_request
from amqp_events.errors import NotModelled
from amqp_events.ordering.runner import Executor, OrderedRunner
from amqp_events.wire.batch import is_batch


class InlineWorker:
    """Runs the messages of one service, one at a time, when asked (:meth:`run`)."""

    def __init__(self, app: Any, executor: Executor) -> None:
        self.app = app
        self.hostname = f"in-process@{app.service}"
        self.pool = InlinePool(app)
        self.accept = prepare_accept_content(app.conf.accept_content)
        self.archiver = Archiver(lambda: app.context, timer=NoArchiveRetries())
        #: Ordered handlers' messages, run by the runner a worker's consumer has, on ``executor``.
        self.runner = OrderedRunner(lambda: app.context, executor)
        #: Each handler task's run on a message, as a solo worker's strategy makes it.
        self.handlers: dict[str, Callable[[Any, Any, Any], None]] = {}

    def run(
        self,
        body: bytes,
        headers: dict[str, Any],
        properties: dict[str, Any],
        delivery_info: dict[str, Any],
        channel: Any,
    ) -> bool:
        """Run one message as the service's worker would; it ends acked or rejected on ``channel``
        (``basic_ack``/``basic_reject``). True: an ordered handler's runner took it, to settle it in its turn
        (behind the message of its key before it, or after its retry's delay)."""
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
        verdict = admit(message, self.app.context, str(channel.queue))
        if verdict is not None:
            self.archiver.take(message, verdict)
            return False
        task = self.app.tasks[message.headers["task"]]
        if is_batch(message.headers):  # its events come one by one, as a worker of Celery's path takes them
            batches.split(self.app.context, task.handler.queue, message, _ack(message), _reject(message))
            return False
        if task.handler.ordered:  # as a worker's partition consumer gives it to its runner
            held = ordered.held_of(self.app, task, message, channel.queue, message.ack, message.reject, self.hostname)
            if held is not None:
                self.runner.take(held)
            return held is not None
        if may_bypass_celery_request(task, sends_events=False) and not needs_celery_request(message.headers, ()):
            self._run_here(task, message)
            return False
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
        return False

    def _run_here(self, task: Any, message: Message) -> None:
        handle = self.handlers.get(task.name)
        if handle is None:
            handle = self.handlers[task.name] = handler_of(task, self.app, self.hostname, ())
        try:
            handle(message, _ack(message), _reject(message))
        except Exception:
            raise
        except BaseException as exc:
            raise lost_process(self.app, exc) from exc


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
            raise lost_process(self.app, exc) from exc
        if callback is not None:
            callback(result)


def lost_process(app: Any, exc: BaseException) -> NotModelled:
    return NotModelled(
        f"a handler of {app.service!r} ended its process ({exc!r}): the in-process mode does not "
        "model lost worker processes; test that with real workers (amqp_events.testing.fixtures)"
    )


class NoArchiveRetries:
    """The archiver's timer: on a real worker, archiving is tried again later; here it cannot fail but by a bug."""

    def call_after(self, delay: float, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        raise NotModelled("archiving a message failed (see the warning logged just before)")
