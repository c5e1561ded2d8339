"""The library's features, in one list: the options each declares for ``@app.handler`` (checked and applied by the
feature itself: :class:`amqp_events.core.options.HandlerOptions`), and the middleware a service gets. The Celery
adapter names no feature: it takes both from here, as dramatiq's broker collects its middleware's actor options.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypedDict

from amqp_events.breakers.options import BREAKER_OPTIONS, BreakerOptions
from amqp_events.core.context import Middleware
from amqp_events.core.handler import RETRY_OPTIONS, Handler, RetryOptions
from amqp_events.core.options import HandlerOptions
from amqp_events.limits.middleware import FlowControl
from amqp_events.limits.options import LIMIT_OPTIONS, LimitOptions
from amqp_events.middleware.cloud_events import CloudEventsReader
from amqp_events.middleware.inbox import INBOX_OPTIONS, InboxMiddleware, InboxOptions
from amqp_events.middleware.logs import EventLog
from amqp_events.middleware.metrics import metrics_for
from amqp_events.middleware.tracing import Tracing
from amqp_events.middleware.upcasting import UPCAST_OPTIONS, Upcasting, UpcastOptions
from amqp_events.ordering.options import ORDERING_OPTIONS, OrderingOptions
from amqp_events.settings import Settings


class CeleryTaskOptions(TypedDict, total=False):
    """The Celery task options a handler may set (any other ``celery.Task`` attribute is taken too)."""

    acks_late: bool
    reject_on_worker_lost: bool
    time_limit: float | None
    soft_time_limit: float | None
    ignore_result: bool
    send_events: bool
    # Celery's retry options, read as the library's own (:func:`amqp_events.celery.handlers.celery_retry_options`).
    retry_backoff: bool | float
    retry_backoff_max: float
    retry_jitter: bool
    autoretry_for: tuple[type[BaseException], ...]
    dont_autoretry_for: tuple[type[BaseException], ...]
    default_retry_delay: float


class HandlerOptionsGiven(
    RetryOptions,
    UpcastOptions,
    InboxOptions,
    BreakerOptions,
    OrderingOptions,
    LimitOptions,
    CeleryTaskOptions,
    total=False,
):
    """Every keyword option of ``@app.handler`` (its ``event``, ``bind`` and ``name`` aside), for type checkers."""


#: The features' handler options, in the order they apply: the inbox's handle comes before the payload that
#: ordering and flow control read keys from, and flow control refuses an ordered handler. Celery's own
#: ``rate_limit=`` (per worker process, what waits held in its memory) is flow control's here, over the fleet.
OPTIONS: tuple[HandlerOptions, ...] = (UPCAST_OPTIONS, INBOX_OPTIONS, BREAKER_OPTIONS, ORDERING_OPTIONS, LIMIT_OPTIONS)
#: The option names the library takes itself (any other is a Celery task option).
LIBRARY_OPTIONS = ("bind", "name", *RETRY_OPTIONS, *(name for feature in OPTIONS for name in feature.defaults))


def with_options(handler: Handler, given: dict[str, Any]) -> Handler:
    """``handler`` with each feature's options taken out of ``given`` (what is left: Celery's), checked and
    applied by the feature."""
    for feature in OPTIONS:
        handler = feature.apply(handler, {name: given.pop(name) for name in feature.defaults if name in given})
    return handler


#: A service's middleware, in order, each made when the service's settings and handlers call for it
#: (:meth:`~amqp_events.core.context.Middleware.for_service`): tracing first, so that its span holds everything
#: the others do.
MIDDLEWARE: tuple[Callable[[Settings, Sequence[Handler], str], Middleware | None], ...] = (
    Tracing.for_service,
    metrics_for,
    CloudEventsReader.for_service,
    Upcasting.for_service,  # before anything reads the arguments
    InboxMiddleware.for_service,
    FlowControl.for_service,
    EventLog.for_service,
)


def standard_middleware(settings: Settings, handlers: Iterable[Handler], version: str) -> list[Middleware]:
    """The library's middleware for a service: only what its settings, its handlers and the installed extras
    call for."""
    listed = list(handlers)
    made = (make(settings, listed, version) for make in MIDDLEWARE)
    return [middleware for middleware in made if middleware is not None]
