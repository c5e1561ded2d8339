"""The Celery app of one service: :func:`events_app`, and what :class:`EventsApp` adds to Celery.

An app is the service's :class:`~amqp_events.core.context.ServiceContext`
made from Celery's configuration (:attr:`EventsApp.context`), and the
decorators and methods users call, each a thin layer over the core.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from amqp_events.archive import Archive
from amqp_events.breakers.breaker import BreakerPolicy
from amqp_events.breakers.health import Health, HealthCheck
from amqp_events.celery import control
from amqp_events.celery.conf import EventsCelery, check_broker_url
from amqp_events.celery.handlers import EventDecorator, HandlerDecorator
from amqp_events.celery.health import HealthProbes
from amqp_events.celery.partitions import Partitions
from amqp_events.celery.producing import Producing
from amqp_events.celery.signals import SettledSignal
from amqp_events.celery.steps import BreakerControl, BreakerState, Heartbeat, InboxPruning, MetricsEndpoint
from amqp_events.celery.task import CONTROL_FLOW
from amqp_events.clock import SYSTEM_CLOCK, Clock
from amqp_events.core.context import Middleware, Middlewares, ServiceContext
from amqp_events.core.events import EventKey, argument_names
from amqp_events.core.handler import Handler
from amqp_events.features import HandlerOptionsGiven, standard_middleware
from amqp_events.history import History
from amqp_events.settings import CELERY_DEFAULTS, QUEUE_LAYOUT, Settings, environment_defaults, raw_settings
from amqp_events.topology import Topology, check_service_name
from amqp_events.topology.names import control_namespace, handler_queue_name
from amqp_events.transport.base import Transport
from amqp_events.transport.rabbitmq import RabbitMQ

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from amqp_events.celery.outbox import Outbox
    from amqp_events.outbox.store import OutboxStore

T = TypeVar("T")

try:
    VERSION = version("celery-amqp-events")
except PackageNotFoundError:  # imported from a source tree that was never installed
    VERSION = "0+unknown"


class EventsApp(Producing, EventsCelery):
    """A Celery app for one service. Create it with :func:`events_app`."""

    def __init__(self, main: str, *args: Any, home: Path | None = None, **kwargs: Any) -> None:
        super().__init__(main, *args, **kwargs)
        self.service = check_service_name(main)
        #: The directory of the module that made the app (where the default SQLite outbox lives).
        self.home = home or Path.cwd()
        #: The service's handlers, by the event each handles.
        self.handlers: dict[str, Handler] = {}
        #: Health checks registered with :meth:`health_check`, by name.
        self.health_checks: dict[str, HealthCheck] = {}
        #: The events this service fires, made with :meth:`event`, by name (what ``asyncapi`` documents).
        self.declared_events: dict[str, Any] = {}
        self.event_versions: dict[str, int] = {}
        self._settings: Settings | None = None
        self._middleware: list[Middleware] = []
        #: What the in-process mode puts in place of the broker, the clock and more middleware (:meth:`using`).
        self._stand_in: tuple[Transport, Clock, tuple[Middleware, ...]] | None = None
        self._context: ServiceContext | None = None

    # -- configuration ----------------------------------------------------------------------------------

    @property
    def events_settings(self) -> Settings:
        """The ``amqp_events_*`` settings, read from ``app.conf`` the first time they are needed.

        That is the first fire (or batch), the first use of the topology (a worker, when it starts), or the
        first read of this property. After that, changing one raises :class:`~amqp_events.SettingsFrozen`."""
        if self._settings is None:
            raw = raw_settings(self.conf)
            check_broker_url(self.conf.broker_url)
            self._settings = Settings.from_raw(raw)
            self._check_placed(self._settings.queue_layout)
            BreakerPolicy.of(self._settings.breaker, None)  # its values checked now, not when a worker starts
            self.freeze_settings(raw, f"at {SYSTEM_CLOCK.now():%H:%M:%S} UTC, when they were first needed")
        return self._settings

    def _check_placed(self, layout: str) -> None:
        """Handlers take their queue from the layout as it was when they were registered: it must not have
        changed since (a worker would consume queues no event reaches)."""
        misplaced = sorted(
            handler.name
            for handler in self.handlers.values()
            if not handler.ordered and handler.queue != handler_queue_name(self.service, handler.task_name, layout)
        )
        if misplaced:
            raise ValueError(
                f"{QUEUE_LAYOUT} of service {self.service!r} is {layout!r}, but {', '.join(misplaced)} were "
                f"registered before it was set: give it to events_app(...) or as AMQP_EVENTS_QUEUE_LAYOUT"
            )

    @property
    def context(self) -> ServiceContext:
        """The service as the core sees it: made when first needed, and again after a change (a handler
        registered, a middleware added, the in-process mode switched on or off)."""
        if self._context is None:
            settings = self.events_settings
            transport, clock, more = self._stand_in or (self.rabbitmq, SYSTEM_CLOCK, ())
            middleware = standard_middleware(settings, self.handlers.values(), VERSION)
            self._context = ServiceContext(
                name=self.service,
                settings=settings,
                handlers=dict(self.handlers),
                transport=transport,
                clock=clock,
                middleware=Middlewares((*middleware, *self._middleware, SettledSignal(), *more)),
                control_flow=CONTROL_FLOW,
                event_versions=self.event_versions,  # the app's own: an event declared later is fired at its version
            )
        return self._context

    def add_middleware(self, middleware: Middleware) -> None:
        """Add ``middleware`` after the library's own (see :class:`amqp_events.core.context.Middleware`)."""
        self._middleware.append(middleware)
        self._context = None

    def add_handler(self, handler: Handler) -> None:
        self.handlers[handler.task_name] = handler
        self._context = None

    @contextmanager
    def using(self, transport: Transport, clock: Clock, *middleware: Middleware) -> Iterator[ServiceContext]:
        """Inside the block, this app sends to ``transport``, reads ``clock`` and has ``middleware`` too:
        the in-process mode of :mod:`amqp_events.testing` (its outbox relay thread does not start)."""
        if self._stand_in is not None:
            raise RuntimeError(f"the app of {self.service!r} is in the in-process mode already")
        self._stand_in, self._context = (transport, clock, middleware), None
        try:
            yield self.context
        finally:
            self._stand_in, self._context = None, None

    @property
    def topology(self) -> Topology:
        """This service's exchanges, queues and bindings (computed, not read from the broker)."""
        return self.context.topology

    def declare_topology(self) -> None:
        """Declare :attr:`topology` on the broker, as a worker does at start-up."""
        context = self.context
        context.transport.declare(context.topology)

    @property
    def transport(self) -> Transport:
        """Where the app's messages go: :attr:`rabbitmq`, or the in-process mode's broker in memory."""
        return self.context.transport

    @cached_property
    def rabbitmq(self) -> RabbitMQ:
        """The app's broker (``broker_url``), with a publisher connection per thread."""
        return RabbitMQ(self, self.events_settings.publish_timeout)

    def close(self) -> None:
        """Close the app's connections, the publisher's included, and stop its in-process outbox relay."""
        if "service_outbox" in self.__dict__:
            self.service_outbox.stop()
        if "rabbitmq" in self.__dict__:
            self.rabbitmq.close()
        super().close()

    # -- producing (the rest: :class:`~amqp_events.celery.producing.Producing`) -----------------------------

    def event(
        self, name: str, *, wire_format: str | None = None, key: EventKey | None = None, version: int = 1
    ) -> EventDecorator:
        """Decorate a validating function, or a dataclass/pydantic model, as the event ``name``.

        ``wire_format`` ("celery" or "cloudevents") overrides the app's
        ``amqp_events_wire_format`` for this event. ``key`` names the
        aggregate each fired event belongs to: the name of an argument (of a
        field, for a class), or a callable given the same arguments (the
        instance, for a class) that returns it. Every fire then carries the
        key's value in the ``event_key`` header (``partitionkey`` as a
        CloudEvent): a string, or an integer sent as its decimal string.
        ``version`` is the version of the event's arguments, carried by every
        fire (the ``event_version`` header); a consumer's ``upcasters`` turn
        an earlier version into the one its handler takes.
        """
        return EventDecorator(self, name, wire_format, key, version)

    # -- the transactional outbox -------------------------------------------------------------------------

    @cached_property
    def service_outbox(self) -> Outbox:
        """The service's outbox (imported on first use: the ``[sqlalchemy]`` extra)."""
        from amqp_events.celery.outbox import Outbox

        return Outbox(self.context, self.outbox_url)

    def outbox(self, transaction: Any) -> Any:
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
        # The in-process mode relays when the test asks it to: no relay thread then.
        return self.service_outbox.writing(transaction, relayed=self._stand_in is None)

    def outbox_async(self, session: Any) -> Any:
        """:meth:`outbox` for asyncio: ``async with app.outbox_async(session):`` on a SQLAlchemy
        ``AsyncSession`` (or ``AsyncConnection``) writes the rows of what is fired inside in its transaction
        when the block ends; the relay publishes them once it committed::

            async with AsyncSession(engine) as session, session.begin():
                session.add(invoice)
                async with app.outbox_async(session):
                    await invoice_paid.fire_async(invoice.id, invoice.amount)
        """
        return self.service_outbox.writing_async(session, relayed=self._stand_in is None)

    @property
    def outbox_url(self) -> str:
        """``amqp_events_outbox_url``, or a SQLite file next to the app."""
        return self.events_settings.outbox_url or f"sqlite:///{self.home / (self.service + '-outbox.sqlite3')}"

    def outbox_store(self, url: str | None = None, engine: Any = None) -> OutboxStore:
        """The outbox on ``engine``, or on the database at ``url`` (default: :attr:`outbox_url`)."""
        return self.service_outbox.store(url, engine)

    # -- consuming ----------------------------------------------------------------------------------------

    def handler(
        self, event: str | type, *, bind: bool = False, name: str | None = None, **options: Unpack[HandlerOptionsGiven]
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
        ``breaker`` (a :class:`~amqp_events.BreakerPolicy`, a dict of
        its fields, True or False; default: the app's ``amqp_events_breaker``)
        pauses consuming this handler's queue while it keeps failing;
        ``requires`` names health checks (:meth:`health_check`) that pause it
        while unhealthy. ``ordered_by`` (the name of the event's argument that
        holds its key, or a callable given the arguments) handles the events of
        one key one at a time, in the order the broker accepted them, through
        retries and crashes (docs/guides/ordering.md); when one of its
        events is archived, ``on_archive`` says whether the later events of
        its key wait for it to be replayed or discarded (``park``) or go on
        (``skip``). ``concurrency`` (runs at once) and ``rate_limit`` (runs started
        per window: ``"50/m"``, ``"10/s,100000/d"``) are counted over every worker of
        the service, on the broker, per key with ``concurrency_key`` and
        ``rate_limit_key``; what waits over a limit waits on the broker
        (docs/guides/flow-control.md). ``upcasters`` (``{1: v1_to_v2}``) turn the arguments of an event
        fired at an earlier version into those of the version the handler takes (the one after the last named),
        before it runs, live or replayed; an event of a later version comes without what it has no parameter
        for. ``name`` registers another handler of an event that has one
        in this service (``@app.handler("user.created", name="welcome_email")``):
        it gets its own queue, retries, archive entries, breaker and metrics.
        Other keyword arguments are Celery task options. Each option belongs to the feature that reads it
        (:mod:`amqp_events.features`). Returns the decorated object.
        """
        return HandlerDecorator(self, event, bind, dict(options), name)

    def event_handlers(self) -> list[Any]:
        """This service's handler tasks."""
        return [self.tasks[event] for event in self.handlers]

    def health_check(
        self, name: str, interval: float = 10.0, timeout: float | None = None
    ) -> Callable[[Callable[[], Health | bool]], Callable[[], Health | bool]]:
        """Register a function returning a :class:`~amqp_events.Health` (or a bool) as the health
        check ``name``, run by the worker every ``interval`` seconds in a thread (at most ``timeout`` s).

        Handlers that ``require`` it are paused while it is unhealthy.
        """

        def register(function: Callable[[], Health | bool]) -> Callable[[], Health | bool]:
            self.health_checks[name] = HealthCheck(name, function, interval, timeout)
            return function

        return register

    # -- operating ----------------------------------------------------------------------------------------

    def archive(self, service: str | None = None) -> Archive:
        """The archive of this service (or of ``service``, another one's on the same broker)."""
        return Archive(self.context, service)

    def history(self) -> History:
        """The vhost's event history (``amqp_events_history``): find, count and replay past events."""
        return History(self.context, {name: argument_names(event) for name, event in self.declared_events.items()})


def events_app(service: str, **celery_settings: Any) -> EventsApp:
    """Create the Celery app of ``service`` with the library's safe defaults.

    Any Celery setting (``broker_url``, ``imports``, ...) or ``amqp_events_*``
    setting can be passed; they override the defaults, as do settings loaded
    later with ``app.config_from_object``, until the app first needs them
    (see :attr:`EventsApp.events_settings`). The environment variables
    ``AMQP_EVENTS_BROKER_URL``, ``AMQP_EVENTS_MAX_RETRIES``,
    ``AMQP_EVENTS_ARCHIVED_MESSAGE_TTL``, ``AMQP_EVENTS_ARCHIVED_QUEUE_LENGTH``
    and ``AMQP_EVENTS_METRICS_PORT`` are read now, below app settings.
    """
    caller = inspect.currentframe()
    module = caller.f_back.f_globals.get("__file__") if caller and caller.f_back else None
    app = EventsApp(service, home=Path(module).resolve().parent if module else None)
    defaults = {**CELERY_DEFAULTS, "control_exchange": control_namespace(service), **environment_defaults()}
    app.add_defaults(lambda: defaults)
    app.steps["worker"].add(MetricsEndpoint)
    app.steps["worker"].add(BreakerState)
    app.steps["consumer"].add(BreakerControl)
    app.steps["consumer"].add(Heartbeat)
    app.steps["consumer"].add(InboxPruning)
    app.steps["consumer"].add(Partitions)
    app.steps["consumer"].add(HealthProbes)
    control.register()
    if celery_settings:
        app.conf.update(celery_settings)
    return app
