"""The library's cross-cutting features as middleware (see :class:`amqp_events.core.context.Middleware`).

* :mod:`~amqp_events.middleware.tracing`: OpenTelemetry spans of firing, handling and replaying;
* :mod:`~amqp_events.middleware.metrics`: Prometheus metrics of firing and handling;
* :mod:`~amqp_events.middleware.cloud_events`: CloudEvents read into event messages;
* :mod:`~amqp_events.middleware.inbox`: exactly-once effects (a handler's inbox or dedup store);
* :mod:`~amqp_events.middleware.logs`: structured log lines about events.

Circuit breakers are middleware too (:mod:`amqp_events.breakers.worker`), added by a worker when it starts.
"""

from __future__ import annotations

from collections.abc import Iterable

from amqp_events.core.context import Middleware
from amqp_events.core.handler import Handler
from amqp_events.inbox.base import effect_stores
from amqp_events.metrics import AVAILABLE as METRICS_AVAILABLE
from amqp_events.metrics.serve import served_here
from amqp_events.middleware.cloud_events import CloudEventsReader
from amqp_events.middleware.inbox import InboxMiddleware
from amqp_events.middleware.logs import EventLog
from amqp_events.middleware.metrics import FiringMetrics, HandlerMetrics
from amqp_events.middleware.tracing import INSTALLED as TRACING_INSTALLED
from amqp_events.middleware.tracing import Tracing
from amqp_events.settings import Settings


def standard_middleware(settings: Settings, handlers: Iterable[Handler], version: str) -> list[Middleware]:
    """The library's middleware for a service, in order: only what its settings, its handlers and the
    installed extras call for. Tracing comes first, so that its span holds everything the others do."""
    chosen: list[Middleware] = []
    if TRACING_INSTALLED:
        chosen.append(Tracing(version, as_child=settings.trace_as_child))
    if METRICS_AVAILABLE:
        served = bool(settings.metrics_port) or served_here()
        chosen.append(HandlerMetrics(settings.metrics_exception_labels) if served else FiringMetrics())
    chosen.append(CloudEventsReader())
    if any(any(effect_stores(handler)) for handler in handlers):
        chosen.append(InboxMiddleware())
    chosen.append(EventLog())
    return chosen
