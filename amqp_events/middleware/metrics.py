"""Prometheus metrics as middleware (the ``[metrics]`` extra): events fired, and handler runs in a worker.

An app installs :class:`FiringMetrics` whenever ``prometheus_client`` is
installed (a producer serves its own registry), and :class:`HandlerMetrics`
instead when something serves a worker's metrics (``amqp_events_metrics_port``,
or ``PROMETHEUS_MULTIPROC_DIR`` set by the application): handler runs cost
nothing otherwise. The instruments are those of :mod:`amqp_events.metrics`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from amqp_events.core.context import Attempt, Firing, Middleware
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Outcome, Redeliver, SendToArchive
from amqp_events.metrics import AVAILABLE, ExceptionLabels, instruments, record_fired
from amqp_events.metrics.serve import served_here
from amqp_events.settings import Settings
from amqp_events.wire.message import queue_wait

#: Every outcome's name (:mod:`amqp_events.core.outcome`), and those that end a message's life.
OUTCOMES = (
    "success",
    "skipped",
    "retry_scheduled",
    "redelivered",
    "handed_back",
    "over_limit",
    "held",
    "postponed",
    "archived",
)
FINAL_OUTCOMES = ("success", "archived")


class FiringMetrics(Middleware):
    """``amqp_events_events_fired_total``, by result."""

    def after_fire(self, firing: Firing, result: str, error: BaseException | None) -> None:
        record_fired(firing.context.name, firing.message.event, result)


def metrics_for(settings: Settings, handlers: Sequence[Handler], version: str) -> FiringMetrics | None:
    """With prometheus-client installed: the handlers' metrics too where the process serves them (a worker)."""
    if not AVAILABLE:
        return None
    served = bool(settings.metrics_port) or served_here()
    return HandlerMetrics(settings.metrics_exception_labels) if served else FiringMetrics()


class HandlerMetrics(FiringMetrics):
    """And each handler's runs: outcomes, failures, durations, queue waits, attempts, in progress; the
    archive, duplicates skipped and ``optional()`` failures."""

    def __init__(self, exception_labels: int = 10) -> None:
        #: Distinct exception class names per handler in labels; the rest are counted as "other".
        self.exception_labels = exception_labels
        self._handlers: dict[tuple[str, str], _Instruments] = {}

    def before_handle(self, attempt: Attempt) -> Outcome | None:
        bound = self._of(attempt)
        attempt.state["metrics_started"] = time.monotonic()
        bound.in_progress.inc()
        wait = queue_wait(attempt.delivery.headers, attempt.context.now())
        if wait is not None:
            bound.queue_wait.observe(max(0.0, wait))
        return None

    def after_handle(self, attempt: Attempt, outcome: Outcome | None, error: BaseException | None) -> None:
        started = attempt.state.pop("metrics_started", None)
        if attempt.handler is not None:
            bound = self._of(attempt)
            if started is not None:
                bound.in_progress.dec()
            if outcome is not None:
                bound.record(outcome, attempt.delivery.retries + 1, started)
        if isinstance(outcome, SendToArchive):
            instruments()["archived"].labels(attempt.context.name, attempt.delivery.event, outcome.reason).inc()

    def optional_failed(self, attempt: Attempt, section: str, error: BaseException) -> None:
        handler = attempt.handler.name if attempt.handler is not None else "-"
        instruments()["optional_failures"].labels(attempt.context.name, handler, section).inc()

    def _of(self, attempt: Attempt) -> _Instruments:
        assert attempt.handler is not None
        key = (attempt.context.name, attempt.handler.name)
        bound = self._handlers.get(key)
        if bound is None:  # made in the process that records (a pool child): label values bound once
            bound = self._handlers[key] = _Instruments(*key, ExceptionLabels(self.exception_labels))
        return bound


class _Instruments:
    """One handler's instruments, with their label values bound once (a lookup per message costs)."""

    def __init__(self, service: str, handler: str, exception_labels: ExceptionLabels) -> None:
        metrics, labels = instruments(), (service, handler)
        self.exception_labels = exception_labels
        self.in_progress = metrics["in_progress"].labels(*labels)
        self.queue_wait = metrics["queue_wait"].labels(*labels)
        self.outcomes = {outcome: metrics["outcomes"].labels(*labels, outcome) for outcome in OUTCOMES}
        self.duration = {outcome: metrics["duration"].labels(*labels, outcome) for outcome in OUTCOMES}
        self.attempts = {outcome: metrics["attempts"].labels(*labels, outcome) for outcome in FINAL_OUTCOMES}
        self.duplicates = metrics["duplicates"].labels(*labels)
        self._failures: Any = metrics["failures"]
        self._labels = labels

    def record(self, outcome: Outcome, attempt: int, started: float | None) -> None:
        name = outcome.name
        self.outcomes[name].inc()
        if started is not None:
            self.duration[name].observe(time.monotonic() - started)
        if name == "skipped":
            self.duplicates.inc()
        elif isinstance(outcome, Redeliver | SendToArchive):
            disposition = "retry" if isinstance(outcome, Redeliver) else "archive"
            label = self.exception_labels.label(outcome.error)
            self._failures.labels(*self._labels, label, disposition).inc()
        if name in FINAL_OUTCOMES:
            self.attempts[name].observe(attempt)
