"""Running a handler task on one delivery in the calling thread, as Celery's own trace would set it up.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/broker/test_celery_compat.py, and every broker test with a solo worker).
"""

from __future__ import annotations

from typing import Any

from celery._state import _task_stack
from celery.app.task import Context
from celery.exceptions import Ignore, Retry

from amqp_events.core import handling
from amqp_events.core.delivery import Delivery


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
