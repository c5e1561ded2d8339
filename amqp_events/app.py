"""The Celery app of one service: :func:`events_app` and what :class:`EventsApp` adds to Celery."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, ParamSpec, TypeVar, cast, overload

from amqp.exceptions import NotFound
from celery import Celery, Task
from celery.app.amqp import AMQP
from kombu.utils.objects import cached_property as kombu_cached_property

from amqp_events import delays
from amqp_events.declare import declare_topology
from amqp_events.events import Event, EventBatch, TopologyMissing, event_class
from amqp_events.handler import EventHandler
from amqp_events.logs import log_event
from amqp_events.message import DUE_AT, OutgoingMessage, event_envelope, isoformat, utcnow
from amqp_events.metrics import record_fired
from amqp_events.metrics import worker as _worker_metrics  # noqa: F401  (connects the worker's signals)
from amqp_events.publisher import Publisher
from amqp_events.settings import CELERY_DEFAULTS, Settings, environment_defaults
from amqp_events.topology import (
    Topology,
    check_event_name,
    check_service_name,
    events_exchange,
    service_topology,
)

logger = logging.getLogger("amqp_events")

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C", bound=type)


class DuplicateHandler(ValueError):
    """A service registered a second handler for the same event."""


#: The batch ``with app.batch():`` opened in this context, if any.
_current_batch: ContextVar[EventBatch | None] = ContextVar("amqp_events_batch", default=None)
_NO_LADDER = (
    "cannot delay {event!r}: the delay ladder is not on the broker yet. Start a worker of any service, "
    "or run `amqp-events -A <app> topology declare`."
)


class EventsAMQP(AMQP):
    """Celery's AMQP helper, consuming the service's event queues (plus any ``task_queues`` given)."""

    @kombu_cached_property
    def queues(self) -> Any:
        app = cast("EventsApp", self.app)
        return self.Queues([*app.topology.event_queues, *(app.conf.task_queues or ())])


class EventDecorator:
    """What ``@app.event(name)`` returns: makes an :class:`Event` or an event class."""

    def __init__(self, app: EventsApp, name: str) -> None:
        self.app, self.name = app, check_event_name(name)

    @overload
    def __call__(self, target: C) -> C: ...

    @overload
    def __call__(self, target: Callable[P, Any]) -> Event[P]: ...

    def __call__(self, target: Any) -> Any:
        if isinstance(target, type):
            return event_class(self.app, self.name, target)
        return Event(self.app, self.name, target)


class EventsApp(Celery):
    """A Celery app for one service. Create it with :func:`events_app`."""

    amqp_cls = "amqp_events.app:EventsAMQP"

    def __init__(self, main: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(main, *args, **kwargs)
        self.service = check_service_name(main)
        self._handlers: dict[str, str] = {}

    # -- configuration ----------------------------------------------------

    @cached_property
    def events_settings(self) -> Settings:
        """The ``amqp_events_*`` settings, read from ``app.conf`` on first use."""
        return Settings.from_conf(self.conf)

    @property
    def topology(self) -> Topology:
        """This service's exchanges, queues and bindings (computed, not read from the broker)."""
        return service_topology(self.service, self._handlers, self.events_settings)

    def declare_topology(self) -> None:
        """Declare :attr:`topology` on the broker, as a worker does at start-up."""
        with self.connection_for_write() as connection:
            declare_topology(connection, self.topology)

    # -- producing --------------------------------------------------------

    def event(self, name: str) -> EventDecorator:
        """Decorate a validating function, or a dataclass/pydantic model, as the event ``name``."""
        return EventDecorator(self, name)

    def fire(
        self,
        event: str,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        countdown: float | None = None,
        eta: datetime | None = None,
    ) -> str:
        """Publish ``event`` (no validation) and return its id once the broker confirmed it.

        With ``countdown`` seconds or an ``eta`` the event first waits on the
        broker's delay ladder, then reaches every subscribed service.
        """
        message = self._event_message(event, args, kwargs or {}, countdown, eta)
        batch = _current_batch.get()
        if batch is not None and batch.app is self:
            batch.publish(message)
            return message.message_id
        try:
            routed = self.publisher.publish(message)
        except Exception as exc:
            record_fired(self.service, event, "error")
            if isinstance(exc, NotFound):
                raise TopologyMissing(_NO_LADDER.format(event=event)) from exc
            raise
        self._fired(message, routed)
        return message.message_id

    @contextmanager
    def batch(self, window: int = 2000) -> Iterator[EventBatch]:
        """Fire many events fast: inside the block, firing returns the event id at once.

        The broker's confirms are collected together (up to ``window``
        messages in flight) and awaited when the block ends; then
        :class:`~amqp_events.PublishError` names any event the broker refused
        or did not confirm in time. Validation still runs at each call::

            with app.batch():
                for invoice in invoices:
                    invoice_paid(invoice.id, invoice.amount)
        """
        batch = EventBatch(self, window)
        token = _current_batch.set(batch)
        try:
            yield batch
            batch.finish()
        finally:
            _current_batch.reset(token)
            batch.close()

    def _event_message(
        self, event: str, args: Any, kwargs: dict[str, Any], countdown: float | None, eta: datetime | None
    ) -> OutgoingMessage:
        check_event_name(event)
        headers, body = event_envelope(event, args, kwargs, self.service)
        if eta is not None and countdown is None:
            countdown = delays.seconds_until(eta)
        delay = delays.whole_seconds(countdown or 0)
        if delay:
            exchange = delays.entry_exchange()
            routing_key = delays.routing_key(delay, delays.event_destination(event))
            headers[DUE_AT] = isoformat(utcnow() + timedelta(seconds=delay))
        else:
            exchange, routing_key = self.events_settings.exchange, event
        return OutgoingMessage(exchange, routing_key, headers, body, headers["id"])

    def _fired(self, message: OutgoingMessage, routed: bool) -> None:
        event = message.headers["task"]
        delayed = message.exchange == delays.entry_exchange()
        record_fired(self.service, event, "confirmed" if routed else "unroutable")
        if delayed and not routed:
            raise TopologyMissing(f"cannot delay {event!r}: a delay queue is missing; declare the topology again")
        if not routed:
            logger.debug(
                "fired event=%s service=%s id=%s: no service subscribes to it", event, self.service, message.message_id
            )
        log_event("fired", event=event, service=self.service, event_id=message.message_id, delayed=delayed)

    @cached_property
    def publisher(self) -> Publisher:
        settings = self.events_settings
        return Publisher(self, settings.publish_timeout, declare=(events_exchange(settings),))

    def close(self) -> None:
        """Close the app's connections, the publisher's included."""
        if "publisher" in self.__dict__:
            self.publisher.close()
        super().close()

    def publish_routed(self, message: OutgoingMessage) -> None:
        """Publish a message that must reach a queue of ours (a retry copy, an archived copy).

        If nothing received it, a queue or exchange was deleted under us:
        declare the topology again and publish once more.
        """
        if self.publisher.publish(message):
            return
        logger.warning(
            "no queue received %r on exchange %r: declaring the topology again",
            message.routing_key,
            message.exchange,
        )
        self.declare_topology()
        if not self.publisher.publish(message):
            raise TopologyMissing(
                f"no queue receives {message.routing_key!r} on exchange {message.exchange!r}, "
                "even after declaring the topology again"
            )

    # -- consuming --------------------------------------------------------

    def handler(
        self,
        event: str | type,
        *,
        bind: bool = False,
        max_retries: int | None = None,
        backoff_base: float | None = None,
        backoff_max: float | None = None,
        jitter: bool | None = None,
        dont_retry: tuple[type[BaseException], ...] = (),
        **task_options: Any,
    ) -> Callable[[T], T]:
        """Register a function (or a ``celery.Task`` subclass) as this service's handler of ``event``.

        ``event`` is a name, or a class made with ``@app.event``: then the
        handler receives an instance of it. ``bind=True`` passes the task as
        ``self``. Retry options default to the app's settings;
        ``dont_retry`` exception types are archived at once. Other keyword
        arguments are Celery task options. Returns the decorated object.
        """
        event_cls = event if isinstance(event, type) else None
        name = check_event_name(getattr(event_cls, "event_name", None) if event_cls else event)  # type: ignore[arg-type]
        given = {
            "max_retries": max_retries,
            "backoff_base": backoff_base,
            "backoff_max": backoff_max,
            "jitter": jitter,
            "dont_retry": tuple(dont_retry),
        }
        attributes = {
            "retry_options": {key: value for key, value in given.items() if value is not None},
            "event_class": event_cls,
            **task_options,
        }

        def register(target: T) -> T:
            described = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}"
            existing = self._handlers.get(name)
            if existing == described:  # the same module imported again
                return target
            if existing is not None:
                raise DuplicateHandler(
                    f"service {self.service!r} already has a handler for event {name!r}: {existing}; "
                    f"{described} cannot be a second one (one handler per event per service)"
                )
            if isinstance(target, type) and issubclass(target, Task):
                bases = (target,) if issubclass(target, EventHandler) else (target, EventHandler)
                namespace = {"name": name, "handler_name": described, "__module__": target.__module__}
                self.register_task(type(target.__name__, cast(tuple[type, ...], bases), {**namespace, **attributes}))
            else:
                function = cast(Callable[..., Any], target)
                self.task(name=name, base=EventHandler, bind=bind, handler_name=described, **attributes)(function)
            self._handlers[name] = described
            return target

        return register


def events_app(service: str, **celery_settings: Any) -> EventsApp:
    """Create the Celery app of ``service`` with the library's safe defaults.

    Any Celery setting (``broker_url``, ``imports``, ...) or ``amqp_events_*``
    setting can be passed; they override the defaults, as do settings loaded
    later with ``app.config_from_object``. The environment variables
    ``AMQP_EVENTS_MAX_RETRIES``, ``AMQP_EVENTS_ARCHIVED_MESSAGE_TTL`` and
    ``AMQP_EVENTS_ARCHIVED_QUEUE_LENGTH`` are read now, below app settings.
    """
    app = EventsApp(service)
    defaults = {**CELERY_DEFAULTS, **environment_defaults()}
    app.add_defaults(lambda: defaults)
    if celery_settings:
        app.conf.update(celery_settings)
    return app
