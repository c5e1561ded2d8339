"""The Celery task behind every ``@app.handler``: a message through the handling pipeline, its outcome
in Celery's terms.

The pipeline (:mod:`amqp_events.core.handling`) runs the handler and settles
its outcome; this module turns that into what Celery expects from a task:
return (ack), raise ``Retry`` (a copy is on its way back; ack) or
:class:`~amqp_events.errors.Archived` (its copy is in the archive; acked by
:class:`~amqp_events.celery.request.EventRequest`, reported as failed).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore, Reject, Retry

from amqp_events.core import handling
from amqp_events.core.delivery import Delivery
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Ack, Outcome, Redeliver, SendToArchive
from amqp_events.core.publishing import describe
from amqp_events.errors import Archived
from amqp_events.topology import delays
from amqp_events.wire.message import ENVELOPE

logger = logging.getLogger(__name__)

#: How a Celery task steers its run: the pipeline lets these pass untouched.
CONTROL_FLOW: tuple[type[BaseException], ...] = (Retry, Ignore, Reject)
#: ``self.retry()`` arguments a handler may give; Celery's others (queue, priority, ...) have no meaning here.
RETRY_ARGUMENTS = ("args", "kwargs", "exc", "throw", "eta", "countdown", "max_retries")


class EventHandler(Task):  # type: ignore[misc]  # celery.Task is untyped
    """Base class of handler tasks. ``@app.handler`` makes one subclass per handled event.

    Subclass it (or any ``celery.Task``) for class-based handlers; override
    :meth:`run`. Inside a handler, ``self.retry(countdown=...)`` waits on the
    broker, and :func:`amqp_events.current_event` describes the event.
    """

    #: Celery builds this worker-side request for every message it runs its own way (the prefork pool, ...:
    #: :mod:`amqp_events.celery.running`): it counts pool processes lost.
    Request = "amqp_events.celery.request:EventRequest"
    #: The handler as the core sees it (set by ``@app.handler``).
    handler: ClassVar[Handler]
    #: Celery logs an archived event's end at info level, without a traceback ("raised expected"): the library
    #: logs it already, as archived.
    throws: ClassVar[tuple[type[BaseException], ...]] = (Archived,)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        # Celery's own rate limit (from task_default_rate_limit or task_annotations) would count per worker process
        # and hold what waits in its memory: a handler's limits are flow control's (rate_limit= on the handler).
        if cls.rate_limit:
            logger.warning(
                "%s: Celery's rate limit %r (task_default_rate_limit or task_annotations) is not applied to a handler:"
                " it would count per worker process and hold what waits in the worker's memory; give the handler "
                "rate_limit= instead, counted over every worker (docs/guides/flow-control.md)",
                cls.name,
                cls.rate_limit,
            )
            cls.rate_limit = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:  # a plain function call, e.g. in a unit test
            return super().__call__(*args, **kwargs)
        handler = self.handler
        outcome, result = handling.handle(self.app.context, handler, delivery_of(request, handler.queue), self.run)
        if isinstance(outcome, Ack):
            return result
        raise in_celery_terms(outcome)

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: Any = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Exception:
        """Run the handler again after ``countdown`` seconds (or at ``eta``), waiting on the broker.

        ``args``/``kwargs`` replace the event's arguments in the retried copy;
        ``max_retries`` applies to this call only. When no retry is left the
        message is archived instead. Use it as ``raise self.retry(...)``.
        Celery's routing options (``queue``, ``priority``, ...) have no meaning
        here and raise ``TypeError``.
        """
        if options:
            raise TypeError(
                f"self.retry() got option(s) it does not support: {', '.join(sorted(options))} "
                f"(it takes {', '.join(RETRY_ARGUMENTS)}): a retry always goes back to this service's queue"
            )
        if eta is not None and countdown is None:
            countdown = delays.seconds_until(eta, self.app.context.now())
        outcome = handling.retry_running(exc, countdown, max_retries, args, kwargs)
        leave = in_celery_terms(outcome)
        if throw:
            raise leave
        return leave


def in_celery_terms(outcome: Outcome) -> Exception:
    """What a task raises for a settled outcome other than an ack; the message is acked either way."""
    if isinstance(outcome, Redeliver):
        error = outcome.error
        retry: Exception = Retry(exc=error if isinstance(error, Exception) else None, when=float(outcome.delay))
        return retry
    assert isinstance(outcome, SendToArchive), outcome
    return Archived(f"archived ({outcome.reason}): {describe(outcome.error)}")


def delivery_of(request: Any, queue: str) -> Delivery:
    """The message a handler runs for, from a task's ``self.request`` or the worker's own ``Request``."""
    message = getattr(request, "message", None)
    if message is not None:  # the worker's main process has the message itself
        headers = dict(message.headers or {})
    else:  # a task's context: Celery's envelope fields plus the message's other headers
        fields = vars(request)
        headers = {key: fields[key] for key in ENVELOPE if fields.get(key) is not None}
        headers.update(request.headers or {})
    info = request.delivery_info or {}
    return Delivery(
        headers=headers,
        queue=queue,
        exchange=info.get("exchange") or "",
        routing_key=info.get("routing_key") or "",
        args=list(request.args or ()),
        kwargs=dict(request.kwargs or {}),
    )
