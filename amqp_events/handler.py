"""The Celery task behind every ``@app.handler``: run, retry on the broker, or archive.

Every message a handler receives ends in exactly one of three ways:

* the handler returns: Celery acks the message;
* the handler raises and may run again: a copy with ``retries + 1`` goes
  through the delay ladder back to this service's queue only, and once the
  broker confirmed the copy, Celery acks the original (``Retry``);
* the handler may not run again (retries exhausted, non-retryable error,
  arguments that do not fit, worker lost too often): a copy goes to the
  service's archive and, once confirmed, the original is acked (``Ignore``).

Messages the broker dead-lettered as rejected come back to the same queue
and count as a failed attempt without running the handler.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Mapping
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from celery import Task, current_task
from celery.exceptions import Ignore, Reject, Retry

from amqp_events import delays
from amqp_events.logs import log_event
from amqp_events.message import (
    DUE_AT,
    EMPTY_EMBED,
    FIRST_FAILURE_AT,
    JSON,
    Delivered,
    EventMetadata,
    Failure,
    OutgoingMessage,
    Reason,
    archived_message,
    copy_headers,
    earlier_deliveries,
    isoformat,
    json_body,
    parse_time,
    queue_wait,
    utcnow,
    was_rejected,
)
from amqp_events.metrics import ExceptionLabels, HandlerRun, record_archived
from amqp_events.retry import GiveUp, RetryPolicy
from amqp_events.topology import event_queue_name

if TYPE_CHECKING:
    from amqp_events.app import EventsApp


class BadArguments(TypeError):
    """The event's arguments do not fit the handler's signature."""


class Rejected(Exception):
    """The message came back dead-lettered as rejected (``basic.reject`` without requeue)."""


class RetryRequested(Exception):
    """``self.retry()`` was called without an exception."""


class WorkerLost(Exception):
    """The message was delivered again and again without an outcome: its worker died each time."""


class EventHandler(Task):
    """Base class of handler tasks. ``@app.handler`` makes one subclass per handled event.

    Subclass it (or any ``celery.Task``) for class-based handlers; override
    :meth:`run`. Inside a handler, ``self.retry(countdown=...)`` waits on the
    broker, and :func:`amqp_events.current_event` describes the event.
    """

    app: EventsApp
    #: ``max_retries``/``backoff_base``/``backoff_max``/``jitter``/``dont_retry`` given to ``@app.handler``.
    retry_options: Mapping[str, Any] = {}
    #: For handlers of class events: the payload is turned into this class before the call.
    event_class: type | None = None
    #: Name of the function or class the user registered, for messages and metrics.
    handler_name: str = ""

    @cached_property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy.from_settings(self.app.events_settings, **self.retry_options)

    @cached_property
    def exception_labels(self) -> ExceptionLabels:
        return ExceptionLabels(self.app.events_settings.metrics_exception_labels)

    @cached_property
    def queue_name(self) -> str:
        return event_queue_name(self.app.service, self.name)

    @cached_property
    def _signature(self) -> inspect.Signature:
        return inspect.signature(self.run)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:  # a plain function call, e.g. in a unit test
            return super().__call__(*args, **kwargs)
        headers = vars(request)
        retries = int(request.retries or 0)
        run = request.metrics_run = HandlerRun(
            self.app.service, self.handler_name, retries + 1, queue_wait(headers), self.exception_labels
        )
        with run:
            deliveries = earlier_deliveries(headers)
            if deliveries >= self.app.events_settings.max_deliveries:
                lost = WorkerLost(f"delivered {deliveries} times before without an ack: the worker running it died")
                raise self._give_up(Reason.WORKER_LOST, lost, attempts=retries + deliveries)
            if was_rejected(headers, self.queue_name):
                raise self._after_failure(Rejected("the message was rejected without requeue"))
            try:
                args, kwargs = self._fit_arguments(args, kwargs)
            except BadArguments as exc:
                raise self._give_up(Reason.BAD_ARGUMENTS, exc, attempts=retries) from None
            try:
                result = self.run(*args, **kwargs)
            except (Retry, Ignore, Reject):
                raise
            except Exception as exc:
                raise self._after_failure(exc) from exc
            run.finish("success")
            self._log("handled", seconds=f"{time.monotonic() - run.started:.3f}")
            return result

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
    ) -> Retry | Ignore:
        """Run the handler again after ``countdown`` seconds (or at ``eta``), waiting on the broker.

        ``max_retries`` applies to this call only. When no retry is left the
        message is archived instead. Use it as ``raise self.retry(...)``.
        """
        if eta is not None and countdown is None:
            countdown = delays.seconds_until(eta)
        error = exc or RetryRequested("the handler asked to be retried")
        outcome = self._after_failure(error, countdown=countdown, max_retries=max_retries, args=args, kwargs=kwargs)
        if throw:
            raise outcome
        return outcome

    # -- outcomes: each publishes a copy, then returns the exception that makes Celery ack

    def _after_failure(
        self,
        exc: BaseException,
        countdown: float | None = None,
        max_retries: int | None = None,
        args: Any = None,
        kwargs: Any = None,
    ) -> Retry | Ignore:
        request = self.request
        retries = int(request.retries or 0)
        decision = self.retry_policy.decide(exc, retries, countdown=countdown, max_retries=max_retries)
        if isinstance(decision, GiveUp):
            return self._give_up(decision.reason, exc, attempts=retries + 1)
        headers = vars(request)
        first_failure_at = parse_time(headers.get(FIRST_FAILURE_AT)) or utcnow()
        copy = copy_headers(headers, retries + 1, **{FIRST_FAILURE_AT: isoformat(first_failure_at)})
        body = [
            list(request.args or () if args is None else args),
            dict(request.kwargs or {} if kwargs is None else kwargs),
        ]
        if decision.delay:
            exchange = delays.entry_exchange()
            routing_key = delays.routing_key(decision.delay, delays.queue_destination(self.queue_name))
            copy[DUE_AT] = isoformat(utcnow() + timedelta(seconds=decision.delay))
        else:
            exchange, routing_key = "", self.queue_name
        self.app.publish_routed(OutgoingMessage(exchange, routing_key, copy, [*body, EMPTY_EMBED], str(request.id)))
        self._metrics(request).finish("retry_scheduled", exc, "retry")
        self._log("retrying", delay=decision.delay, error=_describe(exc))
        return Retry(exc=exc if isinstance(exc, Exception) else None, when=float(decision.delay))

    def _give_up(self, reason: str, exc: BaseException, attempts: int) -> Ignore:
        request = self.request
        headers = vars(request)
        failure = Failure.from_exception(
            reason, exc, attempts=attempts, first_failure_at=parse_time(headers.get(FIRST_FAILURE_AT))
        )
        delivery_info = request.delivery_info or {}
        delivered = Delivered(
            headers=copy_headers(headers, int(request.retries or 0)),
            body=json_body([list(request.args or ()), dict(request.kwargs or {}), EMPTY_EMBED]),
            content_type=JSON,
            content_encoding="utf-8",
            exchange=delivery_info.get("exchange") or "",
            routing_key=delivery_info.get("routing_key") or self.name,
            queue=self.queue_name,
        )
        self.app.publish_routed(archived_message(delivered, failure, self.app.service, self.handler_name))
        self._metrics(request).finish("archived", exc, "archive")
        record_archived(self.app.service, self.name, reason)
        self._log("archived", reason=reason, error=_describe(exc), level=logging.WARNING)
        return Ignore()

    # -- helpers ----------------------------------------------------------

    def _metrics(self, request: Any) -> HandlerRun:
        run = request.get("metrics_run")
        if run is None:  # self.retry() called outside a worker run
            run = HandlerRun(self.app.service, self.handler_name, 1, None, self.exception_labels)
        return run

    def _fit_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.event_class is not None:
            try:
                return (self.event_class(*args, **kwargs),), {}
            except Exception as exc:
                raise BadArguments(f"cannot build {self.event_class.__name__} from the payload: {exc}") from exc
        try:
            self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise BadArguments(f"{self.handler_name}{self._signature} cannot take this payload: {exc}") from exc
        return args, kwargs

    def _log(self, what: str, level: int = logging.INFO, **fields: Any) -> None:
        event = EventMetadata.from_headers(vars(self.request))
        log_event(
            what,
            event=event.name,
            service=self.app.service,
            event_id=event.id,
            attempt=event.attempt,
            level=level,
            handler=self.handler_name,
            **fields,
        )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}({str(exc)[:200]!r})"


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
    return EventMetadata.from_headers(vars(task.request))
