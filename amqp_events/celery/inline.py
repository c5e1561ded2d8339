"""Running one message of a service in the caller's thread, as a ``celery worker`` with the solo pool
would: through the same dispatcher (:mod:`amqp_events.dispatch.dispatcher`), with Celery's ``Request`` traced in this
thread where something configured needs Celery's own path. The in-process mode of :mod:`amqp_events.testing` runs
every message through here, so that an outcome there is decided by the very code a worker runs.

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

from amqp_events.celery.running import CeleryRuntime
from amqp_events.core.router import ToHandler
from amqp_events.dispatch.dispatcher import Dispatcher
from amqp_events.dispatch.settling import Archiver, ChannelSettler
from amqp_events.errors import NotModelled
from amqp_events.ordering.runner import Executor, OrderedRunner


class InlineWorker:
    """Runs the messages of one service, one at a time, when asked (:meth:`run`)."""

    def __init__(self, app: Any, executor: Executor) -> None:
        self.app = app
        self.hostname = f"in-process@{app.service}"
        self.pool = InlinePool(app)
        self.accept = prepare_accept_content(app.conf.accept_content)
        #: Ordered handlers' messages, run by the runner a worker's consumer has, on ``executor``.
        self.runner = OrderedRunner(lambda: app.context, executor)
        archiver = Archiver(lambda: app.context, timer=NoArchiveRetries())
        runtime = CeleryRuntime(app, self.hostname, celery_path=self._traced)
        self.dispatcher = Dispatcher(
            lambda: app.context, runtime, archiver, lambda: self.runner, timer=HeldRuns(executor)
        )

    def run(
        self,
        body: bytes,
        headers: dict[str, Any],
        properties: dict[str, Any],
        delivery_info: dict[str, Any],
        channel: Any,
    ) -> bool:
        """Run one message as the service's worker would; it ends acked or rejected on ``channel``
        (``basic_ack``/``basic_reject``). True: it is settled later: an ordered handler's runner took it, to settle
        it in its turn (behind the message of its key before it, or after its retry's delay), or flow control holds
        it, to run it again on the virtual clock."""
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
        try:
            routed = self.dispatcher.dispatch(message, str(channel.queue), ChannelSettler(message))
        except Exception:
            raise
        except BaseException as exc:
            raise lost_process(self.app, exc) from exc
        return isinstance(routed, ToHandler) and (routed.handler.ordered or not channel.settled)

    def _traced(self, message: Message) -> None:
        """Celery's own request path, traced in this thread (where something configured needs it)."""
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


class HeldRuns:
    """The dispatcher's timer: a message flow control holds runs again on the executor's (virtual) clock."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def call_after(self, seconds: float, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.executor.call_after(seconds, lambda: function(*args), "held")


class NoArchiveRetries:
    """The archiver's timer: on a real worker, archiving is tried again later; here it cannot fail but by a bug."""

    def call_after(self, delay: float, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        raise NotModelled("archiving a message failed (see the warning logged just before)")
