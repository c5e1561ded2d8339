"""The Celery task behind every ``@app.handler``: run the handler, then carry out its outcome.

What happens to a message once its handler ran (or must not run) is decided
by :mod:`amqp_events.outcome` and carried out by :mod:`amqp_events.settle`;
this module turns that into what Celery expects from a task: return (ack),
raise ``Retry`` (a copy is on its way back; ack) or ``Ignore`` (archived; ack).
"""

from __future__ import annotations

import inspect
import logging
import os
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from celery import Task, current_task
from celery.exceptions import Ignore, Reject, Retry

from amqp_events import delays, tracing
from amqp_events.breakers import breakers_of
from amqp_events.clock import utcnow
from amqp_events.errors import BadArguments, RetryRequested
from amqp_events.inbox.base import DedupStore, EffectKey, TransactionalInbox
from amqp_events.message import ENVELOPE, EventMetadata, Reason, queue_wait
from amqp_events.metrics import HandlerMetrics, HandlerRun
from amqp_events.outcome import (
    Ack,
    Archive,
    CannotRun,
    Delivery,
    Failed,
    Handling,
    Lost,
    Outcome,
    Redeliver,
    decide,
    hand_back,
    refusal,
)
from amqp_events.settle import describe, settle
from amqp_events.topology import event_queue_name

if TYPE_CHECKING:
    from amqp_events.app import EventsApp

logger = logging.getLogger(__name__)

#: What a run returns when the effect happened already (the inbox or the dedup store knows its key).
DUPLICATE = object()

#: ``self.retry()`` arguments a handler may give; Celery's others (queue, priority, ...) have no meaning here.
RETRY_ARGUMENTS = ("args", "kwargs", "exc", "throw", "eta", "countdown", "max_retries")


class EventHandler(Task):  # type: ignore[misc]  # celery.Task is untyped
    """Base class of handler tasks. ``@app.handler`` makes one subclass per handled event.

    Subclass it (or any ``celery.Task``) for class-based handlers; override
    :meth:`run`. Inside a handler, ``self.retry(countdown=...)`` waits on the
    broker, and :func:`amqp_events.current_event` describes the event.
    """

    app: EventsApp
    #: Celery builds this worker-side request for every message: it counts pool processes lost.
    Request = "amqp_events._celery_compat:EventRequest"
    #: ``max_retries``/``backoff_base``/``backoff_max``/``jitter``/``dont_retry`` given to ``@app.handler``.
    retry_options: ClassVar[dict[str, Any]] = {}
    #: For handlers of class events: the payload is turned into this class before the call.
    event_class: type | None = None
    #: Name of the function or class the user registered, for messages and metrics.
    handler_name: str = ""
    #: The same-transaction inbox (``@app.handler(inbox=...)``): the handler's first argument is its handle.
    inbox: TransactionalInbox | None = None
    #: The store of effects done (``@app.handler(dedup=...)``), consulted before and recorded after a run.
    dedup: DedupStore | None = None
    #: ``@app.handler(breaker=...)``: None for the app's ``amqp_events_breaker``.
    breaker: Any = None
    #: Names of the health checks it requires (``@app.handler(requires=...)``).
    requires: tuple[str, ...] = ()

    @cached_property
    def handling(self) -> Handling:
        return Handling.from_settings(
            self.app.events_settings, self.app.service, self.handler_name, **self.retry_options
        )

    @cached_property
    def metrics(self) -> HandlerMetrics:
        settings = self.app.events_settings
        # Recorded when served: by the worker's own endpoint, or by the application in multiprocess mode.
        served = bool(settings.metrics_port) or "PROMETHEUS_MULTIPROC_DIR" in os.environ
        return HandlerMetrics(self.app.service, self.handler_name, settings.metrics_exception_labels, served)

    @cached_property
    def queue_name(self) -> str:
        return event_queue_name(self.app.service, self.name)

    @cached_property
    def _signature(self) -> inspect.Signature:
        return inspect.signature(self.run)

    @cached_property
    def _fitting_shapes(self) -> set[tuple[int, frozenset[str]]]:
        """Argument shapes (how many positional, which keywords) already seen to fit the signature."""
        return set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:  # a plain function call, e.g. in a unit test
            return super().__call__(*args, **kwargs)
        delivery = delivery_of(request, self.queue_name)
        run = request.metrics_run = self.metrics_run(delivery)
        as_child = self.app.events_settings.trace_as_child
        with run, tracing.processing(self.app.service, self.handler_name, delivery, as_child):
            refused = refusal(delivery, self.handling)
            if refused is not None:
                raise self.conclude(delivery, refused, run)
            breakers = breakers_of(self.app)
            if breakers is not None and not breakers.may_run(self.queue_name):  # prefetched before it opened
                settle(self.app, delivery, hand_back(delivery, utcnow()), self.handling, run)
                raise Ignore()
            try:
                args, kwargs = self._fit_arguments(args, kwargs)
            except BadArguments as exc:
                raise self.conclude(delivery, CannotRun(Reason.BAD_ARGUMENTS, exc), run) from None
            key = EffectKey(self.app.service, self.handler_name, delivery.event_id)
            try:
                result = self._run_once(key, args, kwargs)
            except (Retry, Ignore, Reject):
                raise
            except Exception as exc:
                raise self.conclude(delivery, Failed(exc), run) from exc
            if result is DUPLICATE:
                settle(self.app, delivery, Ack(duplicate=True), self.handling, run)
                return None
            if self.dedup is not None:
                self._record(key)
            settle(self.app, delivery, Ack(), self.handling, run)
            if breakers is not None:
                breakers.report(self.queue_name, failed=False)
            return result

    def _run_once(self, key: EffectKey, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the handler, unless the inbox or the dedup store knows the effect happened (``DUPLICATE``)."""
        if self.dedup is not None and self.dedup.seen(key):
            return DUPLICATE
        if self.inbox is None:
            return self.run(*args, **kwargs)
        with self.inbox.transaction(key) as (handle, first_time):  # the key first: it holds twins back
            return self.run(handle, *args, **kwargs) if first_time else DUPLICATE

    def _record(self, key: EffectKey) -> None:
        assert self.dedup is not None
        try:
            self.dedup.record(key)
        except Exception as exc:  # the effect happened: running it again would repeat it
            logger.error("could not record %s as done (%s): a duplicate of it would run again", key, describe(exc))

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
            countdown = delays.seconds_until(eta)
        delivery = delivery_of(self.request, self.queue_name)
        if args is not None or kwargs is not None:
            delivery = _with_arguments(delivery, args, kwargs)
        run = self.request.get("metrics_run") or self.metrics_run(delivery)
        error = exc or RetryRequested("the handler asked to be retried")
        outcome = self.conclude(delivery, Failed(error, countdown, max_retries), run)
        if throw:
            raise outcome
        return outcome

    def conclude(self, delivery: Delivery, happened: Failed | CannotRun, run: HandlerRun) -> Exception:
        """Decide and carry out the outcome of a failure; returns the exception that makes Celery ack."""
        outcome = decide(delivery, happened, self.handling, utcnow())
        settle(self.app, delivery, outcome, self.handling, run)
        breakers = breakers_of(self.app)
        if breakers is not None and _unexpected_failure(happened, outcome):
            breakers.report(self.queue_name, failed=True)
        celery_says: Exception = Ignore()  # archived
        if isinstance(outcome, Redeliver):
            error = outcome.error
            celery_says = Retry(exc=error if isinstance(error, Exception) else None, when=float(outcome.delay))
        return celery_says

    def after_lost_process(self, delivery: Delivery) -> None:
        """The pool process running ``delivery`` died: send it back, or archive it after too many losses.

        Called by the worker's main process, which knows which message its
        lost child was running (:class:`amqp_events._celery_compat.EventRequest`)
        and acks the original once this returned.
        """
        outcome = decide(delivery, Lost(), self.handling, utcnow())
        settle(self.app, delivery, outcome, self.handling, self.metrics_run(delivery))

    def metrics_run(self, delivery: Delivery) -> HandlerRun:
        wait = queue_wait(delivery.headers) if self.metrics.enabled else None
        return HandlerRun(self.metrics, delivery.retries + 1, wait)

    def _fit_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.event_class is not None:
            try:
                return (self.event_class(*args, **kwargs),), {}
            except Exception as exc:
                raise BadArguments(f"cannot build {self.event_class.__name__} from the payload: {exc}") from exc
        shape = (len(args), frozenset(kwargs))
        if shape not in self._fitting_shapes:  # whether arguments bind depends on their shape only
            handle = () if self.inbox is None else (None,)  # the inbox's handle comes first
            try:
                self._signature.bind(*handle, *args, **kwargs)
            except TypeError as exc:
                raise BadArguments(f"{self.handler_name}{self._signature} cannot take this payload: {exc}") from exc
            self._fitting_shapes.add(shape)
        return args, kwargs


def _unexpected_failure(happened: Failed | CannotRun, outcome: Outcome) -> bool:
    """Does this outcome count against the handler's breaker? Failures that are retried, or archived
    for running out of retries; not bad input, poison or failures declared permanent."""
    if not isinstance(happened, Failed):
        return False
    return isinstance(outcome, Redeliver) or (isinstance(outcome, Archive) and outcome.reason == Reason.MAX_RETRIES)


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


def _with_arguments(delivery: Delivery, args: Any, kwargs: Any) -> Delivery:
    return replace(
        delivery,
        args=delivery.args if args is None else list(args),
        kwargs=delivery.kwargs if kwargs is None else dict(kwargs),
    )


def current_event() -> EventMetadata:
    """The event the running handler was called for: id, name, fire time, firing service, attempt.

    >>> @app.handler("billing.invoice.paid")  # doctest: +SKIP
    ... def on_invoice_paid(invoice_id, amount):
    ...     if utcnow() - current_event().fired_at > timedelta(days=1):
    ...         return  # too old to act on
    """
    task = current_task
    if task is None or task.request.called_directly:
        raise RuntimeError("current_event() is only available while a handler runs in a worker")
    return EventMetadata.from_headers(delivery_of(task.request, "").headers)
