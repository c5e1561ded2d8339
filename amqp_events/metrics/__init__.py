"""Prometheus metrics recorded by producers and workers (needs the ``[metrics]`` extra).

Without ``prometheus_client`` every ``record_*`` function does nothing. With
it, the instruments are created on first use (handlers' by the metrics
middleware, :mod:`amqp_events.middleware.metrics`), in whatever registry mode the
process is in: in a prefork worker with ``PROMETHEUS_MULTIPROC_DIR`` set (the
worker sets it when ``amqp_events_metrics_port`` is configured), each child
writes its own files and the worker's main process serves the sum.

Labels are bounded by design: service, event, handler (the registered
function's name), outcome, reason, and the exception's class name, capped per
handler (see :class:`ExceptionLabels`). Never a hostname of a producer, a PID,
a task id or an exception message.
"""

from __future__ import annotations

import threading
from functools import cache
from importlib.util import find_spec
from typing import Any

#: prometheus_client is imported on first use only, so that a worker can still
#: switch it to multiprocess mode (an environment variable read at import).
AVAILABLE = find_spec("prometheus_client") is not None

PREFIX = "amqp_events_"
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400)
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 11, 16, 21, 31)
OTHER = "other"


class ExceptionLabels:
    """One handler's exception class names as label values: the first ``limit`` distinct ones, then ``other``.

    Each worker process keeps its own first ``limit`` names.
    """

    def __init__(self, limit: int = 10) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def label(self, exception: BaseException) -> str:
        name = type(exception).__name__
        with self._lock:
            if name in self._seen:
                return name
            if len(self._seen) < self.limit:
                self._seen.add(name)
                return name
        return OTHER


_made: dict[str, Any] | None = None
_making = threading.Lock()


def made() -> bool:
    """Were this process's instruments created already?"""
    return _made is not None


def instruments() -> dict[str, Any]:
    """The instruments, created once per process on first use, by whichever thread comes first (Prometheus's
    registry refuses a second creation)."""
    global _made
    if _made is None:
        with _making:
            if _made is None:
                _made = _create()
    return _made


def _create() -> dict[str, Any]:
    from prometheus_client import Counter, Gauge, Histogram

    return {
        "fired": Counter(
            PREFIX + "events_fired", "Events fired, by result: confirmed, unroutable (no subscriber) or error.",
            ["service", "event", "result"],
        ),
        "outcomes": Counter(
            PREFIX + "handler_outcomes",
            "Runs by outcome: success, skipped, retry_scheduled, redelivered, handed_back, over_limit, held, postponed, archived",  # noqa: E501
            ["service", "handler", "outcome"],
        ),
        "failures": Counter(
            PREFIX + "handler_failures", "Handler failures by exception class and what happened next.",
            ["service", "handler", "exception", "disposition"],
        ),
        "duration": Histogram(
            PREFIX + "handler_duration_seconds", "Handler run time, successes and failures alike.",
            ["service", "handler", "outcome"], buckets=DURATION_BUCKETS,
        ),
        "queue_wait": Histogram(
            PREFIX + "queue_wait_seconds",
            "From when a message was due (fired, or its retry delay over) to its handler's start.",
            ["service", "handler"], buckets=WAIT_BUCKETS,
        ),
        "attempts": Histogram(
            PREFIX + "handler_attempts", "Attempts a message took to reach its final outcome.",
            ["service", "handler", "outcome"], buckets=ATTEMPT_BUCKETS,
        ),
        "archived": Counter(
            PREFIX + "archived", "Messages sent to the archive, by reason.", ["service", "event", "reason"]
        ),
        "in_progress": Gauge(
            PREFIX + "handlers_in_progress", "Handlers running right now.", ["service", "handler"],
            multiprocess_mode="livesum",
        ),
        "duplicates": Counter(
            PREFIX + "duplicates_skipped", "Deliveries skipped because the handler's effect had happened already.",
            ["service", "handler"],
        ),
        "optional_failures": Counter(
            PREFIX + "optional_failures", "Failures inside optional() sections: logged, and the handler went on.",
            ["service", "handler", "section"],
        ),
        "breaker_state": Gauge(
            PREFIX + "breaker_state", "A handler's circuit breaker: 0 closed, 1 open, 2 half-open.",
            ["service", "handler"], multiprocess_mode="max",
        ),
        "breaker_trips": Counter(
            PREFIX + "breaker_trips", "Times a handler's circuit breaker opened after failures.", ["service", "handler"]
        ),
        "health": Gauge(
            PREFIX + "health_check_state", "A health check's state: 0 healthy, 1 degraded, 2 unhealthy.",
            ["service", "check"], multiprocess_mode="max",
        ),
        "limit_runs": Gauge(
            PREFIX + "limit_runs", "Runs of a limited handler holding a place of its concurrency limit now.",
            ["service", "handler"], multiprocess_mode="livesum",
        ),
        "limit_starts": Counter(
            PREFIX + "limit_starts", "Runs of a limited handler its limits let start (their rate: its rate now).",
            ["service", "handler"],
        ),
        "limit_waits": Counter(
            PREFIX + "limit_waits", "Events that found their handler's limit reached and wait on the broker, by "
            "limit (concurrency, rate) and key (the hottest keys; the others: other).",
            ["service", "handler", "limit", "key"],
        ),
        "parked_keys": Gauge(
            PREFIX + "parked_keys", "Keys of ordered handlers parked behind an archived event, by partition.",
            ["service", "partition"], multiprocess_mode="max",
        ),
        "outbox_published": Counter(
            PREFIX + "outbox_published", "Outbox rows a relay published (confirmed) and deleted.", ["service"]
        ),
        "outbox_failed": Counter(
            PREFIX + "outbox_failed", "Outbox rows that failed to publish: tried again (retry) or set aside (dead).",
            ["service", "disposition"],
        ),
        "outbox_pending": Gauge(
            PREFIX + "outbox_pending", "Outbox rows waiting to be published.", ["table"], multiprocess_mode="max"
        ),
        "outbox_oldest": Gauge(
            PREFIX + "outbox_oldest_pending_age_seconds", "Age of the oldest outbox row waiting to be published.",
            ["table"], multiprocess_mode="max",
        ),
        "outbox_dead": Gauge(
            PREFIX + "outbox_dead", "Outbox rows set aside as unpublishable.", ["table"], multiprocess_mode="max"
        ),
    }  # fmt: skip


def record_fired(service: str, event: str, result: str) -> None:
    if AVAILABLE:
        _fired(service, event, result).inc()


@cache
def _fired(service: str, event: str, result: str) -> Any:
    return instruments()["fired"].labels(service, event, result)


def record_breaker(service: str, handler: str, state: int, tripped: bool) -> None:
    if AVAILABLE:
        metrics = instruments()
        metrics["breaker_state"].labels(service, handler).set(int(state))
        if tripped:
            metrics["breaker_trips"].labels(service, handler).inc()


def record_health(service: str, check: str, state: int) -> None:
    if AVAILABLE:
        instruments()["health"].labels(service, check).set(state)


def record_parked_keys(service: str, partition: str, keys: int) -> None:
    if AVAILABLE:
        instruments()["parked_keys"].labels(service, partition).set(keys)


def record_limit_run(service: str, handler: str, change: int) -> None:
    """A run of a limited handler took (``1``) or gave back (``-1``) a place of its concurrency limit."""
    if AVAILABLE:
        instruments()["limit_runs"].labels(service, handler).inc(change)


def record_limit_start(service: str, handler: str) -> None:
    if AVAILABLE:
        instruments()["limit_starts"].labels(service, handler).inc()


def record_limit_wait(service: str, handler: str, limit: str, key: str) -> None:
    if AVAILABLE:
        instruments()["limit_waits"].labels(service, handler, limit, key).inc()


class OutboxMetrics:
    """A relay's metrics (recorded only when prometheus-client is installed)."""

    def __init__(self, table: str) -> None:
        self.table = table

    def published(self, service: str) -> None:
        if AVAILABLE:
            instruments()["outbox_published"].labels(service).inc()

    def failed(self, service: str, disposition: str) -> None:
        if AVAILABLE:
            instruments()["outbox_failed"].labels(service, disposition).inc()

    def pending(self, rows: int, oldest_age: float, dead: int) -> None:
        if AVAILABLE:
            metrics = instruments()
            metrics["outbox_pending"].labels(self.table).set(rows)
            metrics["outbox_oldest"].labels(self.table).set(oldest_age)
            metrics["outbox_dead"].labels(self.table).set(dead)
