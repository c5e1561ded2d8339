"""Celery's worker-side request for a handler's message, counting pool processes lost exactly.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0, billiard 4.3.2 (tests/broker/test_celery_compat.py,
tests/broker/test_worker_lost.py).
"""

from __future__ import annotations

import logging
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery.worker.request import Request
from celery.worker.state import task_ready

from amqp_events.celery.task import EventHandler, delivery_of
from amqp_events.core import handling

logger = logging.getLogger(__name__)


class EventRequest(Request):  # type: ignore[misc]
    """Upstream: when the pool process running a message dies, ``on_failure``
    gets a ``WorkerLostError`` (5.7 also turns a ``SystemExit`` or
    ``KeyboardInterrupt`` the process reported before it ended into one;
    5.5 and 5.6 fail the task with it) and requeues the message
    (``task_reject_on_worker_lost``); the broker would then count every
    return alike, also those of messages a dying worker had only prefetched.
    The main process knows which message its lost child was running, so it
    decides that one: run again, or archive after
    ``amqp_events_max_deliveries`` losses; then ack.
    """

    task: EventHandler

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        if not self._lost_its_process(exc_info.exception):
            return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        task_ready(self)
        handler = self.task.handler
        try:
            handling.lost(self.task.app.context, handler, delivery_of(self, handler.queue))
        except Exception:
            logger.exception("could not handle the loss of the process running %s; requeueing it", self.id)
            self.reject(requeue=True)
            return None
        self.acknowledge()
        return None

    def _lost_its_process(self, exc: BaseException) -> bool:
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if not self.task.acks_late:
            return False
        if isinstance(exc, WorkerLostError):
            return True
        # The process ended the run itself; unless this worker killed it (revoked, cancelled), it is lost.
        return isinstance(exc, (SystemExit, KeyboardInterrupt)) and not (
            self._already_cancelled or self._already_revoked
        )
