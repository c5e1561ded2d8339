"""Celery as the dispatcher's host (:class:`CeleryRuntime`): a handler task run on one delivery in the calling
thread, as Celery's own trace would set it up, or, where something configured relies on it, Celery's own request
path.

Upstream: a task's ``Strategy`` (``celery.worker.strategy:default``) turns each message into a ``Request``, logs
it, sends ``task_received`` and hands it to the pool, which traces the run (signals, states) and acks it once done.
Each step costs, per message, and an event handler needs none of it, unless the prefork pool's children run it, task
events are on, a task has a rate limit, or a receiver of Celery's task signals is connected.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/broker/test_celery_compat.py, and every broker test with a solo worker).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from celery import signals
from celery._state import _task_stack
from celery.app.task import Context
from celery.exceptions import Ignore, Reject, Retry
from celery.utils.saferepr import saferepr

from amqp_events.core import handling
from amqp_events.core.delivery import Delivery
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Outcome, RejectedByHandler

#: Celery's own loggers of a run's start and end (``-l info``), as its request path and trace use them.
received_logger = logging.getLogger("celery.worker.strategy")
trace_logger = logging.getLogger("celery.app.trace")
#: How much of the arguments a task event shows (Celery's own default, ``argsrepr_maxsize``).
ARGSREPR = 1024

#: Celery's task signals: a receiver of any of them gets Celery's own path.
TASK_SIGNALS = (
    signals.task_received,
    signals.before_task_publish,
    signals.task_prerun,
    signals.task_postrun,
    signals.task_success,
    signals.task_failure,
    signals.task_retry,
    signals.task_revoked,
)


def run_here(app: Any, task: Any, delivery: Delivery, delivery_info: Any, hostname: str, can_hold: bool = False) -> Any:
    """Run ``task``'s handler for ``delivery`` through the handling pipeline; returns the outcome settled (``can_hold``:
    the caller keeps a message flow control holds, and runs it again later).

    ``None``: the handler raised Celery's ``Ignore`` (or ``Retry``) itself. Upstream: a task's code finds
    itself on Celery's task stack, and a bound handler its ``self.request``, only if they are pushed here.
    """
    handler = task.handler
    _task_stack.push(task)
    if handler.takes_self:
        context = {"delivery_info": delivery_info, "hostname": hostname, "called_directly": False}
        request = Context(delivery.headers, args=delivery.args, kwargs=delivery.kwargs, is_eager=False, **context)
        task.request_stack.push(request)
    try:
        outcome, _ = handling.handle(app.context, handler, delivery, task.run, can_hold)
        return outcome
    except (Ignore, Retry):
        return None
    finally:
        if handler.takes_self:
            task.request_stack.pop()
        _task_stack.pop()


class CeleryRuntime:
    """Celery, the host of a worker's dispatcher (:class:`amqp_events.dispatch.runtime.Runtime`).

    ``celery_path``: hands a message to Celery's own request path (``None``: there is none, every message runs
    here); ``bypass``: may messages skip it at all (not with the prefork pool); ``events``: are task events on
    (``-E``)."""

    def __init__(
        self,
        app: Any,
        hostname: str,
        celery_path: Callable[[Any], Any] | None = None,
        bypass: bool = True,
        events: bool = False,
    ) -> None:
        self.app, self.hostname, self.celery_path, self.bypass, self.events = app, hostname, celery_path, bypass, events
        self.logs_runs = app.context.settings.log_runs and received_logger.isEnabledFor(logging.INFO)
        self.tasks: dict[str, Any] = {}

    def task_of(self, handler: Handler) -> Any:
        task = self.tasks.get(handler.task_name)
        if task is None:
            task = self.tasks[handler.task_name] = self.app.tasks[handler.task_name]
        return task

    def run(
        self, handler: Handler, delivery: Delivery, delivery_info: Mapping[str, Any], can_hold: bool = False
    ) -> Outcome | RejectedByHandler | None:
        try:
            task = self.task_of(handler)
            outcome: Outcome | None = run_here(self.app, task, delivery, delivery_info, self.hostname, can_hold)
        except Reject as exc:  # the handler rejected its message itself
            return RejectedByHandler(bool(exc.requeue))
        return outcome

    def takes_over(self, handler: Handler) -> bool:
        """Does ``handler``'s message need Celery's own request path (see the module's text)?"""
        if self.celery_path is None:
            return False
        task = self.task_of(handler)
        events = self.events and task.send_events
        bypassed = self.bypass and task.acks_late and not task.rate_limit and not events
        return not bypassed or any(signal.receivers for signal in TASK_SIGNALS)

    def take_over(self, handler: Handler, message: Any) -> None:
        assert self.celery_path is not None
        if self.events:  # what its task events show of the arguments, as Celery's own sender writes it
            args, kwargs, _ = message.decode()
            message.headers.update(argsrepr=saferepr(args, ARGSREPR), kwargsrepr=saferepr(kwargs, ARGSREPR))
        self.celery_path(message)

    def received(self, handler: Handler, delivery: Delivery) -> None:
        received_logger.info("Task %s[%s] received", handler.task_name, delivery.event_id)

    def succeeded(self, handler: Handler, delivery: Delivery, seconds: float) -> None:
        trace_logger.info("Task %s[%s] succeeded in %ss: %s", handler.task_name, delivery.event_id, seconds, None)
