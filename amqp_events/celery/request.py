"""Celery's worker-side request for a handler's message: pool processes lost counted exactly, and what Celery's
own path reports (task events, revocations) made to say what the library did with the message.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0, billiard 4.3.2 (tests/broker/test_celery_compat.py,
tests/broker/test_worker_lost.py, tests/broker/test_celery_operators.py).
"""

from __future__ import annotations

import logging
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery.utils.saferepr import saferepr
from celery.worker.request import Request
from celery.worker.state import task_ready

from amqp_events.celery.task import EventHandler, delivery_of
from amqp_events.core import handling
from amqp_events.errors import Archived, Revoked
from amqp_events.transport.acks import ack_at_once
from amqp_events.wire.message import Reason

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
    ``amqp_events_max_deliveries`` losses; then ack. A run past its hard time
    limit (its process killed) counts the same way, as on the consuming pool.

    An event the library archived reaches Celery as :class:`~amqp_events.errors.Archived`: acked (its copy is
    in the archive), reported ``task-failed``. A revoked one (``celery control revoke``, ``--terminate``) is
    archived with reason ``revoked`` before Celery acks it, where Celery would drop it.
    """

    task: EventHandler

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if isinstance(exc, Archived):
            task_ready(self)
            if send_failed_event:
                self.send_event("task-failed", exception=saferepr(exc), traceback=exc_info.traceback)
            self.acknowledge_replaced()
            return None
        if not self._lost_its_process(exc):
            return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        task_ready(self)
        handler = self.task.handler
        try:
            handling.lost(self.task.app.context, handler, delivery_of(self, handler.queue))
        except Exception:
            logger.exception("could not handle the loss of the process running %s; requeueing it", self.id)
            self.reject(requeue=True)
            return None
        self.acknowledge_replaced()
        return None

    def on_retry(self, exc_info: Any) -> None:
        """Upstream: the event shows ``Retry``'s ``exc``; the handler's own exception is shown, not a ``Retry``
        wrapped in another."""
        if self.task.acks_late:
            self.acknowledge_replaced()
        exc: Any = getattr(exc_info.exception, "exc", None)
        while getattr(exc, "exc", None) is not None:  # a Retry of a Retry (self.retry() raised inside the handler)
            exc = exc.exc
        self.send_event("task-retried", exception=saferepr(exc), traceback=str(exc_info.traceback))

    def _announce_revoked(self, reason: str, terminated: bool, signum: Any, expired: bool) -> None:
        """Upstream: a revoked message is acked and gone; here it is archived first, for an operator to replay."""
        handler = self.task.handler
        why = Reason.EXPIRED if expired else Reason.REVOKED
        error = Revoked(f"its id was revoked (celery control revoke{' --terminate' if terminated else ''}): {reason}")
        try:
            handling.archive_refused(self.task.app.context, delivery_of(self, handler.queue), why, error, handler)
        except Exception:
            logger.exception("could not archive the revoked %s; it stays on the broker", self.id)
            self._already_revoked = True
            return
        ack_at_once(self.message)
        super()._announce_revoked(reason, terminated, signum, expired)

    def acknowledge_replaced(self) -> None:
        """Ack a message whose copy took its place (a retry, the archive, a lost run counted): at once, never held
        with others (:mod:`amqp_events.transport.acks`), or the message and its copy could both come back."""
        ack_at_once(self.message)
        self.acknowledge()

    def _lost_its_process(self, exc: BaseException) -> bool:
        if not self.task.acks_late or self._already_revoked:
            return False
        if isinstance(exc, WorkerLostError | TimeLimitExceeded):  # a hard time limit kills the process too
            return True
        # The process ended the run itself; unless this worker killed it (revoked, cancelled), it is lost.
        return isinstance(exc, (SystemExit, KeyboardInterrupt)) and not self._already_cancelled
