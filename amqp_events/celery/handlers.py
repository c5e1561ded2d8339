"""``@app.handler`` and ``@app.event``: a function or class made into a handler task, or a fireable event."""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable
from typing import Any, ParamSpec, Protocol, TypeVar, cast, overload

from celery import Task

from amqp_events.celery.task import EventHandler
from amqp_events.core.events import Event, EventKey, Fires, event_class
from amqp_events.core.handler import RETRY_OPTIONS, Handler
from amqp_events.coroutines import is_coroutine_handler, run_to_completion
from amqp_events.errors import DuplicateHandler
from amqp_events.features import LIBRARY_OPTIONS, with_options
from amqp_events.settings import QUEUE_LAYOUT
from amqp_events.topology import check_event_name
from amqp_events.topology.names import handler_queue_name, intake_queue_name, task_name
from amqp_events.wire import cloud_events

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C", bound=type)


class Registry(Fires, Protocol):
    """What the decorators need of an app (:class:`amqp_events.celery.EventsApp`)."""

    handlers: dict[str, Handler]
    declared_events: dict[str, Any]
    #: The version each declared event is fired at.
    event_versions: dict[str, int]

    def add_handler(self, handler: Handler) -> None: ...

    def task(self, *args: Any, **options: Any) -> Any: ...

    def register_task(self, task: Any, **options: Any) -> Any: ...

    @property
    def conf(self) -> Any: ...


class EventDecorator:
    """What ``@app.event(name)`` returns: makes an :class:`~amqp_events.core.events.Event` or an event class."""

    def __init__(
        self, app: Registry, name: str, wire_format: str | None = None, key: EventKey | None = None, version: int = 1
    ) -> None:
        self.app, self.name, self.key = app, check_event_name(name), key
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"event {name!r}: version must be a whole number from 1, not {version!r}")
        self.version = version
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
        self.app.event_versions[self.name] = self.version
        return fireable


class HandlerDecorator:
    """What ``@app.handler(event, ...)`` returns: registers a function or a ``celery.Task`` subclass."""

    def __init__(
        self, app: Registry, event: str | type, bind: bool, options: dict[str, Any], label: str | None = None
    ) -> None:
        self.app, self.bind, self.options = app, bind, options
        self.event_class = event if isinstance(event, type) else None
        self.event = check_event_name(event if isinstance(event, str) else getattr(event, "event_name", None))
        self.label = label
        self.task_name = task_name(self.event, label)

    def __call__(self, target: T) -> T:
        app, event = self.app, self.event
        described = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}"
        existing = app.handlers.get(self.task_name)
        if existing is not None and existing.name == described:  # the same module imported again
            return target
        if existing is not None:
            named = "" if self.label is None else f" named {self.label!r}"
            raise DuplicateHandler(
                f"service {app.service!r} already has a handler{named} for event {event!r}: {existing.name}; "
                f"{described} cannot be a second one (give each further handler of an event its own name: "
                f"@app.handler({event!r}, name=...))"
            )
        options = dict(self.options)
        # A class-based handler's call is its run(self, ...); a function is called as it is.
        function = cast(Callable[..., Any], target.run if isinstance(target, type) else target)  # type: ignore[attr-defined]
        if inspect.isasyncgenfunction(function):
            raise TypeError(f"{described} is an async generator: a handler returns, it does not yield")
        given_retries = {name: value for name in RETRY_OPTIONS if (value := options.pop(name, None)) not in (None, ())}
        retry_options = {**celery_retry_options(target, options, described), **given_retries}
        handler = Handler(
            event=event,
            name=described,
            # Read as given (not the settings, which reading freezes): the app checks it when it reads them.
            queue=handler_queue_name(app.service, self.task_name, app.conf.get(QUEUE_LAYOUT) or "per_handler"),
            function=function,
            takes_self=self.bind or isinstance(target, type),
            event_class=self.event_class,
            retry_options=retry_options,
            label=self.label,
        )
        handler = with_options(handler, options)  # each feature takes, checks and applies its own
        if handler.ordered and self.label is not None:
            raise TypeError(
                f"{described}: a named handler cannot be ordered (ordered_by): the service's partitions carry one "
                f"ordered handler per event; order {event!r} in its unnamed handler"
            )
        if handler.ordered:  # its messages come in through the service's intake
            handler = dataclasses.replace(handler, queue=intake_queue_name(app.service))
        check_task_options(options, described)
        if is_coroutine_handler(function):
            limit = options.get("soft_time_limit")
            function = run_to_completion(function, lambda: limit or app.conf.task_soft_time_limit)
        attributes = {"handler": handler, **options}  # what is left: Celery's own task options
        if isinstance(target, type) and issubclass(target, Task):
            bases = (target,) if issubclass(target, EventHandler) else (target, EventHandler)
            namespace = {"name": self.task_name, "__module__": target.__module__, "run": function, **attributes}
            app.register_task(type(target.__name__, cast(tuple[type, ...], bases), namespace))
        else:
            # Not shared: Celery would add a shared task to every app of the process (several services).
            task = app.task(name=self.task_name, base=EventHandler, bind=self.bind, shared=False, **attributes)
            task(with_a_name(function))
        app.add_handler(handler)
        return target


def with_a_name(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, with a name Celery can compile its argument check from (``def <lambda>(...)`` would not be
    Python): a lambda's copy named ``handler``."""
    if getattr(function, "__name__", "") != "<lambda>":
        return function
    copy = types.FunctionType(
        function.__code__, function.__globals__, "handler", function.__defaults__, function.__closure__
    )
    copy.__kwdefaults__, copy.__module__ = function.__kwdefaults__, function.__module__
    return copy


def check_task_options(options: dict[str, Any], described: str) -> None:
    """What is left of ``@app.handler``'s ``options`` once the library took its own must be Celery task options
    (attributes of ``celery.Task``): a misspelt option would otherwise become a task attribute nothing reads."""
    unknown = sorted(name for name in options if not hasattr(Task, name))
    if unknown:
        raise TypeError(
            f"{described}: unknown handler option(s) {', '.join(unknown)}: the library's are "
            f"{', '.join(LIBRARY_OPTIONS)}; any other is a Celery task option (acks_late, time_limit...)"
        )


#: Celery's retry options, each as the library's retry policy says it (``None``: refused, with the reason).
CELERY_RETRY_OPTIONS = ("max_retries", "retry_backoff", "retry_backoff_max", "retry_jitter", "autoretry_for",
                        "dont_autoretry_for", "default_retry_delay")  # fmt: skip
#: What a class-based handler inherits from Celery's ``Task``: a value it did not set itself.
_CELERY_DEFAULTS = {name: getattr(Task, name, None) for name in CELERY_RETRY_OPTIONS}


def celery_retry_options(target: Any, options: dict[str, Any], described: str) -> dict[str, Any]:
    """Celery's retry options given to ``@app.handler`` (taken out of ``options``) or set on a ``Task``
    subclass, as the library's own; those it has no equivalent for are refused, saying what to use."""
    given = {name: options.pop(name) for name in CELERY_RETRY_OPTIONS if name in options}
    if isinstance(target, type):
        given.update(
            (name, getattr(target, name))
            for name in CELERY_RETRY_OPTIONS
            if name not in given and getattr(target, name, None) != _CELERY_DEFAULTS[name]
        )
    mapped: dict[str, Any] = {}
    for name, value in given.items():
        if name == "max_retries" and value is not None:
            mapped["max_retries"] = value
        elif name == "retry_backoff" and value:
            mapped["backoff_base"] = 1.0 if value is True else float(value)
        elif name == "retry_backoff_max":
            mapped["backoff_max"] = float(value)
        elif name == "retry_jitter":
            mapped["jitter"] = bool(value)
        elif name == "dont_autoretry_for":
            mapped["dont_retry"] = tuple(value)
        elif name == "autoretry_for" and value and not any(kind in (Exception, BaseException) for kind in value):
            raise TypeError(
                f"{described}: autoretry_for={value!r}: here every exception is retried (on the broker); name "
                "those that must not be with dont_retry=(...), or raise amqp_events.PermanentFailure"
            )
        elif name == "default_retry_delay":
            raise TypeError(
                f"{described}: default_retry_delay: retries wait backoff_base * 2**(attempt-1) seconds on the broker "
                "(backoff_base, backoff_max); for a fixed wait raise self.retry(countdown=N)"
            )
    return mapped
