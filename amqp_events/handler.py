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
and count as a failed attempt without running the handler. A pool process
that dies while running a message is noticed by the worker's main process,
which calls :meth:`EventHandler.after_worker_lost` (see :mod:`amqp_events.worker`).
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from celery import Task, current_task
from celery.exceptions import Ignore, Reject, Retry

from amqp_events import delays, logs
from amqp_events.logs import log_event
from amqp_events.message import (
    DUE_AT,
    EMPTY_EMBED,
    ENVELOPE,
    FIRST_FAILURE_AT,
    JSON,
    LOST_RUNS,
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
from amqp_events.metrics import HandlerMetrics, HandlerRun, record_archived
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
    """The process running the handler died (SIGKILL, OOM, a crash) before the message was acked."""


@dataclass(frozen=True)
class Delivery:
    """The message a handler is running for, as its task or the worker's main process sees it."""

    headers: Mapping[str, Any]
    args: list[Any]
    kwargs: dict[str, Any]
    exchange: str
    routing_key: str

    @classmethod
    def of(cls, request: Any) -> Delivery:
        """From a task's ``self.request`` or a worker-side ``celery.worker.request.Request``."""
        message = getattr(request, "message", None)
        if message is not None:  # the worker's main process has the message itself
            headers = dict(message.headers or {})
        else:  # a task's context: Celery's envelope fields plus the message's other headers
            fields = vars(request)
            headers = {key: fields[key] for key in ENVELOPE if fields.get(key) is not None}
            headers.update(request.headers or {})
        info = request.delivery_info or {}
        return cls(
            headers=headers,
            args=list(request.args or ()),
            kwargs=dict(request.kwargs or {}),
            exchange=info.get("exchange") or "",
            routing_key=info.get("routing_key") or "",
        )

    @property
    def retries(self) -> int:
        return int(self.headers.get("retries") or 0)


class EventHandler(Task):
    """Base class of handler tasks. ``@app.handler`` makes one subclass per handled event.

    Subclass it (or any ``celery.Task``) for class-based handlers; override
    :meth:`run`. Inside a handler, ``self.retry(countdown=...)`` waits on the
    broker, and :func:`amqp_events.current_event` describes the event.
    """

    app: EventsApp
    #: Celery builds this worker-side request for every message: it counts pool processes lost.
    Request = "amqp_events.worker:EventRequest"
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
    def metrics(self) -> HandlerMetrics:
        settings = self.app.events_settings
        # Recorded when served: by the worker's own endpoint, or by the application in multiprocess mode.
        served = bool(settings.metrics_port) or "PROMETHEUS_MULTIPROC_DIR" in os.environ
        return HandlerMetrics(self.app.service, self.handler_name, settings.metrics_exception_labels, served)

    @cached_property
    def _fitting_shapes(self) -> set[tuple[int, frozenset[str]]]:
        """Argument shapes (how many positional, which keywords) already seen to fit the signature."""
        return set()

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
        delivery = Delivery.of(request)
        run = request.metrics_run = self._metrics_run(delivery)
        with run:
            returns = earlier_deliveries(delivery.headers)
            if returns >= self.app.events_settings.max_redeliveries:
                lost = WorkerLost(f"returned to its queue {returns} times without an outcome")
                raise self._give_up(delivery, Reason.WORKER_LOST, lost, delivery.retries + 1, run)
            if was_rejected(delivery.headers, self.queue_name):
                raise self._after_failure(delivery, Rejected("the message was rejected without requeue"), run)
            try:
                args, kwargs = self._fit_arguments(args, kwargs)
            except BadArguments as exc:
                raise self._give_up(delivery, Reason.BAD_ARGUMENTS, exc, delivery.retries, run) from None
            try:
                result = self.run(*args, **kwargs)
            except (Retry, Ignore, Reject):
                raise
            except Exception as exc:
                raise self._after_failure(delivery, exc, run) from exc
            run.finish("success")
            # Debug: Celery logs every success at info level already.
            self._log(delivery, "handled", level=logging.DEBUG, seconds=f"{time.monotonic() - run.started:.3f}")
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
        delivery = Delivery.of(self.request)
        if args is not None:
            delivery = replace(delivery, args=list(args))
        if kwargs is not None:
            delivery = replace(delivery, kwargs=dict(kwargs))
        run = self.request.get("metrics_run") or self._metrics_run(delivery)
        error = exc or RetryRequested("the handler asked to be retried")
        outcome = self._after_failure(delivery, error, run, countdown=countdown, max_retries=max_retries)
        if throw:
            raise outcome
        return outcome

    def after_worker_lost(self, delivery: Delivery) -> None:
        """The pool process running ``delivery`` died: run it again, or archive it after too many losses.

        Called by the worker's main process, which knows exactly which message
        its lost child was running; the copy (or the archived copy) is
        confirmed before the original is acked.
        """
        lost = int(delivery.headers.get(LOST_RUNS) or 0) + 1
        run = self._metrics_run(delivery)
        error = WorkerLost(f"the process running the handler died ({lost} time(s) so far)")
        if lost >= self.app.events_settings.max_deliveries:
            self._give_up(delivery, Reason.WORKER_LOST, error, delivery.retries + lost, run)
            return
        headers = {**copy_headers(delivery.headers, delivery.retries), LOST_RUNS: lost}
        self._publish_copy(delivery, headers, delay=0)
        run.finish("retry_scheduled", error, "retry")
        self._log(delivery, "redelivering", error=_describe(error))

    # -- outcomes: each publishes a copy, then returns the exception that makes Celery ack

    def _after_failure(
        self,
        delivery: Delivery,
        exc: BaseException,
        run: HandlerRun,
        countdown: float | None = None,
        max_retries: int | None = None,
    ) -> Retry | Ignore:
        retries = delivery.retries
        decision = self.retry_policy.decide(exc, retries, countdown=countdown, max_retries=max_retries)
        if isinstance(decision, GiveUp):
            return self._give_up(delivery, decision.reason, exc, retries + 1, run)
        first_failure_at = parse_time(delivery.headers.get(FIRST_FAILURE_AT)) or utcnow()
        headers = copy_headers(delivery.headers, retries + 1, **{FIRST_FAILURE_AT: isoformat(first_failure_at)})
        self._publish_copy(delivery, headers, decision.delay)
        run.finish("retry_scheduled", exc, "retry")
        self._log(delivery, "retrying", delay=decision.delay, error=_describe(exc))
        return Retry(exc=exc if isinstance(exc, Exception) else None, when=float(decision.delay))

    def _publish_copy(self, delivery: Delivery, headers: dict[str, Any], delay: int) -> None:
        """Send a copy of ``delivery`` back to this service's queue alone, after ``delay`` seconds."""
        if delay:
            exchange = delays.entry_exchange()
            routing_key = delays.routing_key(delay, delays.queue_destination(self.queue_name))
            headers[DUE_AT] = isoformat(utcnow() + timedelta(seconds=delay))
        else:
            exchange, routing_key = "", self.queue_name
        body = [delivery.args, delivery.kwargs, EMPTY_EMBED]
        self.app.publish_routed(OutgoingMessage(exchange, routing_key, headers, body, str(delivery.headers["id"])))

    def _give_up(self, delivery: Delivery, reason: str, exc: BaseException, attempts: int, run: HandlerRun) -> Ignore:
        failure = Failure.from_exception(
            reason, exc, attempts=attempts, first_failure_at=parse_time(delivery.headers.get(FIRST_FAILURE_AT))
        )
        delivered = Delivered(
            headers=copy_headers(delivery.headers, delivery.retries),
            body=json_body([delivery.args, delivery.kwargs, EMPTY_EMBED]),
            content_type=JSON,
            content_encoding="utf-8",
            exchange=delivery.exchange,
            routing_key=delivery.routing_key or self.name,
            queue=self.queue_name,
        )
        self.app.publish_routed(archived_message(delivered, failure, self.app.service, self.handler_name))
        run.finish("archived", exc, "archive")
        record_archived(self.app.service, self.name, reason)
        self._log(delivery, "archived", reason=reason, error=_describe(exc), level=logging.WARNING)
        return Ignore()

    # -- helpers ----------------------------------------------------------

    def _metrics_run(self, delivery: Delivery) -> HandlerRun:
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
            try:
                self._signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise BadArguments(f"{self.handler_name}{self._signature} cannot take this payload: {exc}") from exc
            self._fitting_shapes.add(shape)
        return args, kwargs

    def _log(self, delivery: Delivery, what: str, level: int = logging.INFO, **fields: Any) -> None:
        if not logs.logger.isEnabledFor(level):
            return
        event = EventMetadata.from_headers(delivery.headers)
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
