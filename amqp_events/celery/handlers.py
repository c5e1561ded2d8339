"""``@app.handler`` and ``@app.event``: a function or class made into a handler task, or a fireable event."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, Protocol, TypeVar, cast, overload

from celery import Task

from amqp_events.celery.task import EventHandler
from amqp_events.core.events import Event, EventKey, Fires, event_class
from amqp_events.core.handler import Handler
from amqp_events.errors import DuplicateHandler
from amqp_events.topology import check_event_name, event_queue_name, ordered_exchange_name
from amqp_events.wire import cloud_events

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C", bound=type)


class Registry(Fires, Protocol):
    """What the decorators need of an app (:class:`amqp_events.celery.EventsApp`)."""

    handlers: dict[str, Handler]
    declared_events: dict[str, Any]

    def add_handler(self, handler: Handler) -> None: ...

    def task(self, *args: Any, **options: Any) -> Any: ...

    def register_task(self, task: Any, **options: Any) -> Any: ...


class EventDecorator:
    """What ``@app.event(name)`` returns: makes an :class:`~amqp_events.core.events.Event` or an event class."""

    def __init__(self, app: Registry, name: str, wire_format: str | None = None, key: EventKey | None = None) -> None:
        self.app, self.name, self.key = app, check_event_name(name), key
        self.wire_format = None if wire_format is None else cloud_events.check_wire_format(wire_format)
        if not (key is None or callable(key) or (isinstance(key, str) and key.isidentifier())):
            raise ValueError(f"event {name!r}: key must be an argument's name or a callable, not {key!r}")

    @overload
    def __call__(self, target: C) -> C: ...

    @overload
    def __call__(self, target: Callable[P, Any]) -> Event[P]: ...

    def __call__(self, target: Any) -> Any:
        make = event_class if isinstance(target, type) else Event
        fireable = make(self.app, self.name, target, self.wire_format, self.key)
        self.app.declared_events[self.name] = fireable
        return fireable


class HandlerDecorator:
    """What ``@app.handler(event, ...)`` returns: registers a function or a ``celery.Task`` subclass."""

    def __init__(self, app: Registry, event: str | type, bind: bool, options: dict[str, Any]) -> None:
        self.app, self.bind, self.options = app, bind, options
        self.event_class = event if isinstance(event, type) else None
        self.event = check_event_name(event if isinstance(event, str) else getattr(event, "event_name", None))

    def __call__(self, target: T) -> T:
        app, event = self.app, self.event
        described = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}"
        existing = app.handlers.get(event)
        if existing is not None and existing.name == described:  # the same module imported again
            return target
        if existing is not None:
            raise DuplicateHandler(
                f"service {app.service!r} already has a handler for event {event!r}: {existing.name}; "
                f"{described} cannot be a second one (one handler per event per service)"
            )
        options = dict(self.options)
        # A class-based handler's call is its run(self, ...); a function is called as it is.
        function = cast(Callable[..., Any], target.run if isinstance(target, type) else target)  # type: ignore[attr-defined]
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            # A worker would call it, get a coroutine back unrun, and ack the event: refuse it where it is written.
            raise TypeError(
                f"{described} is an async def: coroutine handlers are not supported yet. Write the handler as a "
                "plain def (call your coroutine with asyncio.run() inside it if you must)"
            )
        handler = Handler(
            event=event,
            name=described,
            queue=ordered_exchange_name(app.service)
            if self.options.get("ordered_by")
            else event_queue_name(app.service, event),
            function=function,
            takes_self=self.bind or isinstance(target, type),
            event_class=self.event_class,
            retry_options=options.pop("retry_options"),
            inbox=options.pop("inbox"),
            dedup=options.pop("dedup"),
            breaker=options.pop("breaker"),
            requires=tuple(options.pop("requires")),
            ordered_by=options.pop("ordered_by"),
            on_archive=options.pop("on_archive", "park"),
        )
        attributes = {"handler": handler, **options}  # what is left: Celery's own task options
        if isinstance(target, type) and issubclass(target, Task):
            bases = (target,) if issubclass(target, EventHandler) else (target, EventHandler)
            namespace = {"name": event, "__module__": target.__module__, **attributes}
            app.register_task(type(target.__name__, cast(tuple[type, ...], bases), namespace))
        else:
            # Not shared: Celery would add a shared task to every app of the process (several services).
            app.task(name=event, base=EventHandler, bind=self.bind, shared=False, **attributes)(function)
        app.add_handler(handler)
        return target
