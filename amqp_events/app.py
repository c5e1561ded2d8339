"""The Celery app of one service: :func:`events_app` and what :class:`EventsApp` adds to Celery."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast, overload

from amqp.exceptions import NotFound
from celery import Task

from amqp_events import _celery_compat, cloud_events, delays, tracing
from amqp_events.breaker import BreakerPolicy
from amqp_events.breakers import BreakerControl, BreakerState
from amqp_events.clock import utcnow
from amqp_events.errors import DuplicateHandler, TopologyMissing
from amqp_events.events import Event, EventBatch, event_class
from amqp_events.handler import EventHandler
from amqp_events.health import Health, HealthCheck
from amqp_events.logs import log_event
from amqp_events.message import OutgoingMessage, event_envelope, new_event_id
from amqp_events.metrics import record_fired
from amqp_events.metrics.worker import Heartbeat, MetricsEndpoint
from amqp_events.settings import CELERY_DEFAULTS, Settings, environment_defaults, raw_settings
from amqp_events.topology import Topology, check_event_name, check_service_name, service_topology
from amqp_events.transport import RabbitMQ, Transport, replacement
from amqp_events.worker import InboxPruning

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from amqp_events.inbox.base import DedupStore, TransactionalInbox
    from amqp_events.outbox.relay import RelayThread
    from amqp_events.outbox.schema import OutboxTables
    from amqp_events.outbox.store import OutboxStore
    from amqp_events.outbox.writer import OutboxWriter

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C", bound=type)

#: The batch ``with app.batch():`` opened in this context, if any.
_current_batch: ContextVar[EventBatch | None] = ContextVar("amqp_events_batch", default=None)
#: The outbox ``with app.outbox(...):`` opened in this context, if any.
_current_outbox: ContextVar[OutboxWriter | None] = ContextVar("amqp_events_outbox", default=None)
_NO_LADDER = (
    "cannot delay {event!r}: the delay ladder is not on the broker yet. Start a worker of any service, "
    "or run `amqp-events -A <app> topology declare`."
)


class EventDecorator:
    """What ``@app.event(name)`` returns: makes an :class:`Event` or an event class."""

    def __init__(self, app: EventsApp, name: str, wire_format: str | None = None) -> None:
        self.app, self.name = app, check_event_name(name)
        self.wire_format = None if wire_format is None else cloud_events.check_wire_format(wire_format)

    @overload
    def __call__(self, target: C) -> C: ...

    @overload
    def __call__(self, target: Callable[P, Any]) -> Event[P]: ...

    def __call__(self, target: Any) -> Any:
        fireable = (event_class if isinstance(target, type) else Event)(self.app, self.name, target, self.wire_format)
        self.app.declared_events[self.name] = fireable
        return fireable


class EventsApp(_celery_compat.EventsCelery):
    """A Celery app for one service. Create it with :func:`events_app`."""

    def __init__(self, main: str, *args: Any, home: Path | None = None, **kwargs: Any) -> None:
        super().__init__(main, *args, **kwargs)
        self.service = check_service_name(main)
        #: The directory of the module that made the app (where the default SQLite outbox lives).
        self.home = home or Path.cwd()
        self._handlers: dict[str, str] = {}
        self._settings: Settings | None = None
        #: Health checks registered with :meth:`health_check`, by name.
        self.health_checks: dict[str, HealthCheck] = {}
        #: The events this service fires, made with :meth:`event`, by name (what ``asyncapi`` documents).
        self.declared_events: dict[str, Any] = {}

    # -- configuration ----------------------------------------------------

    @property
    def events_settings(self) -> Settings:
        """The ``amqp_events_*`` settings, read from ``app.conf`` the first time they are needed.

        That is the first fire (or batch), the first use of the topology (a
        worker, when it starts), or the first read of this property. After
        that, changing one of them raises :class:`~amqp_events.SettingsFrozen`.
        """
        if self._settings is None:
            raw = raw_settings(self.conf)
            self._settings = Settings.from_raw(raw)
            self.freeze_settings(raw, f"at {utcnow():%H:%M:%S} UTC, when they were first needed")
        return self._settings

    @property
    def topology(self) -> Topology:
        """This service's exchanges, queues and bindings (computed, not read from the broker)."""
        return service_topology(self.service, self._handlers, self.events_settings)

    def declare_topology(self) -> None:
        """Declare :attr:`topology` on the broker, as a worker does at start-up."""
        self.transport.declare(self.topology)

    # -- producing --------------------------------------------------------

    def event(self, name: str, *, wire_format: str | None = None) -> EventDecorator:
        """Decorate a validating function, or a dataclass/pydantic model, as the event ``name``.

        ``wire_format`` ("celery" or "cloudevents") overrides the app's
        ``amqp_events_wire_format`` for this event.
        """
        return EventDecorator(self, name, wire_format)

    def wire_format(self, given: str | None = None) -> str:
        """The wire format an event fires in: ``given``, else the app's ``amqp_events_wire_format``."""
        return cloud_events.check_wire_format(given) if given else self.events_settings.wire_format

    def fire(
        self,
        event: str,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        countdown: float | None = None,
        eta: datetime | None = None,
        event_id: str | None = None,
        wire_format: str | None = None,
    ) -> str:
        """Publish ``event`` (no validation) and return its id once the broker confirmed it.

        With ``countdown`` seconds or an ``eta`` the event first waits on the
        broker's delay ladder, then reaches every subscribed service.
        ``event_id`` fires it under a given id instead of a new one: to fire
        again an event whose firing raised :class:`~amqp_events.PublishError`
        (its ``event_ids``), so that a copy that did reach the broker is the
        same event to every inbox. ``wire_format`` overrides the app's
        ``amqp_events_wire_format`` ("cloudevents" takes keyword arguments only).
        """
        direct, delay = self._fired_message(event, args, kwargs or {}, countdown, eta, event_id, wire_format)
        with tracing.publishing(self.service, direct, delay):
            return self._publish_fired(direct, delay)

    def _publish_fired(self, direct: OutgoingMessage, delay: int) -> str:
        """Write ``direct`` to the outbox, add it to the batch or publish it, as the caller's block says."""
        event = direct.event
        writer = _current_outbox.get()
        if writer is not None and writer.app is self:
            writer.write(direct, delay)
            record_fired(self.service, event, "outbox")
            return direct.message_id
        message = direct.after(delay, delays.event_destination(event), utcnow())
        batch = _current_batch.get()
        if batch is not None and batch.app is self:
            batch.publish(message)
            return message.message_id
        try:
            routed = self.transport.publish(message)
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
        writer = _current_outbox.get()
        if writer is not None and writer.app is self:  # rows written together when the batch ends
            with writer.batch() as written:
                yield written  # type: ignore[misc]
            return
        batch = EventBatch(self, window)
        token = _current_batch.set(batch)
        try:
            yield batch
            batch.finish()
        finally:
            _current_batch.reset(token)
            batch.close()

    def event_message(
        self,
        event: str,
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
        countdown: float | None = None,
        eta: datetime | None = None,
        wire_format: str | None = None,
    ) -> OutgoingMessage:
        """The message that fires ``event``, ready to publish (no validation, nothing sent)."""
        direct, delay = self._fired_message(event, args, kwargs, countdown, eta, wire_format=wire_format)
        return direct.after(delay, delays.event_destination(event), utcnow())

    def _fired_message(
        self,
        event: str,
        args: Any,
        kwargs: dict[str, Any],
        countdown: float | None,
        eta: datetime | None,
        event_id: str | None = None,
        wire_format: str | None = None,
    ) -> tuple[OutgoingMessage, int]:
        """The message that fires ``event`` at once, and how many seconds it must wait first."""
        check_event_name(event)
        if self.wire_format(wire_format) == "cloudevents":
            if args:
                raise ValueError(
                    f"cannot fire {event!r} as a CloudEvent with positional arguments: its data is a JSON object "
                    "of keyword arguments"
                )
            message_id = new_event_id(event_id)
            headers: dict[str, Any] = cloud_events.binary_headers(event, message_id, self.service, utcnow())
            body: Any = dict(kwargs)
        else:
            headers, body = event_envelope(event, args, kwargs, self.service, event_id)
            message_id = headers["id"]
        if eta is not None and countdown is None:
            countdown = delays.seconds_until(eta)
        message = OutgoingMessage(self.events_settings.exchange, event, headers, body, message_id)
        return message, delays.whole_seconds(countdown or 0)

    def _fired(self, message: OutgoingMessage, routed: bool) -> None:
        event = message.event
        record_fired(self.service, event, "confirmed" if routed else "unroutable")
        if message.delayed and not routed:
            raise TopologyMissing(f"cannot delay {event!r}: a delay queue is missing; declare the topology again")
        if not routed:
            logger.debug(
                "fired event=%s service=%s id=%s: no service subscribes to it", event, self.service, message.message_id
            )
        log_event("fired", event=event, service=self.service, event_id=message.message_id, delayed=message.delayed)

    @property
    def transport(self) -> Transport:
        """Where the app's messages go: :attr:`rabbitmq`, or the in-process mode of :mod:`amqp_events.testing`."""
        return replacement() or self.rabbitmq

    @cached_property
    def rabbitmq(self) -> RabbitMQ:
        """The app's broker (``broker_url``), with a publisher connection per thread."""
        return RabbitMQ(self)

    def close(self) -> None:
        """Close the app's connections, the publisher's included, and stop its in-process outbox relay."""
        relay = self.__dict__.get("outbox_relay")
        if relay is not None:
            relay.stop()
        if "rabbitmq" in self.__dict__:
            self.rabbitmq.close()
        super().close()

    # -- the transactional outbox -----------------------------------------------------------------

    @contextmanager
    def outbox(self, transaction: Any) -> Iterator[OutboxWriter]:
        """Fire into the application's own transaction: inside the block, firing writes a row instead of publishing.

        ``transaction`` is the database handle the business writes use: a
        SQLAlchemy ``Session`` or ``Connection``, or a Django connection. The
        event is validated and built as usual and its row inserted there, so
        it is published (by a relay) if and only if that transaction commits::

            with Session(engine) as session, session.begin():
                session.add(invoice)
                with app.outbox(session):
                    invoice_paid(invoice.id, invoice.amount)
        """
        from amqp_events.outbox.writer import OutboxWriter, target_of

        writer = OutboxWriter(self, target_of(transaction, self.outbox_tables))
        token = _current_outbox.set(writer)
        try:
            yield writer
        finally:
            _current_outbox.reset(token)

    @cached_property
    def outbox_tables(self) -> OutboxTables:
        from amqp_events.outbox.schema import outbox_tables

        settings = self.events_settings
        return outbox_tables(settings.outbox_table, settings.outbox_schema)

    @property
    def outbox_url(self) -> str:
        """``amqp_events_outbox_url``, or a SQLite file next to the app."""
        return self.events_settings.outbox_url or f"sqlite:///{self.home / (self.service + '-outbox.sqlite3')}"

    def outbox_store(self, url: str | None = None, engine: Engine | None = None) -> OutboxStore:
        """The outbox on ``engine``, or on the database at ``url`` (default: :attr:`outbox_url`)."""
        from sqlalchemy import create_engine

        from amqp_events.outbox.store import OutboxStore

        engine = engine or create_engine(url or self.outbox_url, pool_pre_ping=True)
        return OutboxStore(engine, self.outbox_tables, self.events_settings.outbox_max_attempts)

    @cached_property
    def outbox_relay(self) -> RelayThread | None:
        """The in-process relay (``amqp_events_outbox_relay``), started on the first outbox write."""
        if not self.events_settings.outbox_relay:
            return None
        from amqp_events.outbox.relay import RelayThread

        return RelayThread(self)

    def publish_routed(self, message: OutgoingMessage) -> None:
        """Publish a message that must reach a queue of ours (a retry copy, an archived copy).

        If nothing received it, a queue or exchange was deleted under us:
        declare the topology again and publish once more.
        """
        if self.transport.publish(message):
            return
        logger.warning(
            "no queue received %r on exchange %r: declaring the topology again",
            message.routing_key,
            message.exchange,
        )
        self.declare_topology()
        if not self.transport.publish(message):
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
        inbox: TransactionalInbox | None = None,
        dedup: DedupStore | None = None,
        breaker: BreakerPolicy | dict[str, Any] | bool | None = None,
        requires: tuple[str, ...] | list[str] = (),
        **task_options: Any,
    ) -> Callable[[T], T]:
        """Register a function (or a ``celery.Task`` subclass) as this service's handler of ``event``.

        ``event`` is a name, or a class made with ``@app.event``: then the
        handler receives an instance of it. ``bind=True`` passes the task as
        ``self``. Retry options default to the app's settings;
        ``dont_retry`` exception types are archived at once. ``inbox`` (an
        :class:`amqp_events.inbox.Inbox`) runs the handler in a transaction
        that records the event, handed to it as its first argument, so that
        its effect happens once; ``dedup`` (a store such as
        :class:`amqp_events.inbox.RedisDedup`) skips events already handled.
        ``breaker`` (a :class:`~amqp_events.breaker.BreakerPolicy`, a dict of
        its fields, True or False; default: the app's ``amqp_events_breaker``)
        pauses consuming this handler's queue while it keeps failing;
        ``requires`` names health checks (:meth:`health_check`) that pause it
        while unhealthy. Other keyword arguments are Celery task options.
        Returns the decorated object.
        """
        event_cls = event if isinstance(event, type) else None
        name = check_event_name(event if isinstance(event, str) else getattr(event, "event_name", None))
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
            "inbox": inbox,
            "dedup": dedup,
            "breaker": breaker,
            "requires": tuple(requires),
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
            if inbox is not None:
                _takes_a_handle(target, bind, described)
            if isinstance(target, type) and issubclass(target, Task):
                bases = (target,) if issubclass(target, EventHandler) else (target, EventHandler)
                namespace = {"name": name, "handler_name": described, "__module__": target.__module__}
                self.register_task(type(target.__name__, cast(tuple[type, ...], bases), {**namespace, **attributes}))
            else:
                function = cast(Callable[..., Any], target)
                # Not shared: Celery would add a shared task to every app of the process (several services).
                self.task(name=name, base=EventHandler, bind=bind, shared=False, handler_name=described, **attributes)(
                    function
                )
            self._handlers[name] = described
            return target

        return register

    def event_handlers(self) -> list[EventHandler]:
        """This service's handler tasks."""
        return [task for task in self.tasks.values() if isinstance(task, EventHandler) and task.name in self._handlers]

    def health_check(
        self, name: str, interval: float = 10.0, timeout: float | None = None
    ) -> Callable[[Callable[[], Health | bool]], Callable[[], Health | bool]]:
        """Register a function returning a :class:`~amqp_events.health.Health` (or a bool) as the health
        check ``name``, run by the worker every ``interval`` seconds in a thread (at most ``timeout`` s).

        Handlers that ``require`` it are paused while it is unhealthy.
        """

        def register(function: Callable[[], Health | bool]) -> Callable[[], Health | bool]:
            self.health_checks[name] = HealthCheck(name, function, interval, timeout)
            return function

        return register


def _takes_a_handle(target: Any, bind: bool, described: str) -> None:
    """A handler with an inbox receives the transaction's handle first: refuse one that cannot take it."""
    run = cast(Any, target).run if isinstance(target, type) else target  # a Task class: its unbound run
    parameters = list(inspect.signature(run).parameters.values())
    if bind or isinstance(target, type):
        parameters = parameters[1:]  # self
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not parameters or parameters[0].kind not in (*positional, inspect.Parameter.VAR_POSITIONAL):
        raise TypeError(
            f"{described} has an inbox, so it receives the inbox's session or connection as its first "
            "argument: add a parameter for it, e.g. def handler(session, ...)"
        )


def events_app(service: str, **celery_settings: Any) -> EventsApp:
    """Create the Celery app of ``service`` with the library's safe defaults.

    Any Celery setting (``broker_url``, ``imports``, ...) or ``amqp_events_*``
    setting can be passed; they override the defaults, as do settings loaded
    later with ``app.config_from_object``, until the app first needs them
    (see :attr:`EventsApp.events_settings`). The environment variables
    ``AMQP_EVENTS_MAX_RETRIES``, ``AMQP_EVENTS_ARCHIVED_MESSAGE_TTL``,
    ``AMQP_EVENTS_ARCHIVED_QUEUE_LENGTH`` and ``AMQP_EVENTS_METRICS_PORT``
    are read now, below app settings.
    """
    caller = inspect.currentframe()
    module = caller.f_back.f_globals.get("__file__") if caller and caller.f_back else None
    app = EventsApp(service, home=Path(module).resolve().parent if module else None)
    defaults = {**CELERY_DEFAULTS, **environment_defaults()}
    app.add_defaults(lambda: defaults)
    app.steps["worker"].add(MetricsEndpoint)
    app.steps["worker"].add(BreakerState)
    app.steps["consumer"].add(BreakerControl)
    app.steps["consumer"].add(Heartbeat)
    app.steps["consumer"].add(InboxPruning)
    if celery_settings:
        app.conf.update(celery_settings)
    return app
