"""Fireable events: what ``@app.event`` turns a function or a class into."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Generic, ParamSpec, Protocol, TypedDict, TypeVar

from amqp_events.core.arguments import Arguments

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

P = ParamSpec("P")
C = TypeVar("C", bound=type)

#: What ``@app.event(key=...)`` takes: the name of an argument (or field), or a callable that returns the key.
EventKey = str | Callable[..., Any]


class FireOptions(TypedDict, total=False):
    """The keyword options of firing an event by name (``app.fire``, ``app.fire_async``)."""

    #: Seconds the event first waits on the broker's delay ladder (or ``eta``, a datetime).
    countdown: float | None
    eta: datetime | None
    #: Fire it under this id instead of a new one (again, after a ``PublishError``).
    event_id: str | None
    #: "celery" or "cloudevents": overrides the app's ``amqp_events_wire_format``.
    wire_format: str | None
    #: The aggregate the event belongs to (the ``event_key`` header).
    key: str | int | None


class Fires(Protocol):
    """What an event fires through: the app of the service that declared it."""

    service: str

    def fire(
        self,
        event: str,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Unpack[FireOptions],
    ) -> str: ...

    async def fire_async(
        self,
        event: str,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Unpack[FireOptions],
    ) -> str: ...

    def wire_format(self, given: str | None = None) -> str: ...

    def handler(self, event: str, *, bind: bool = False) -> Callable[[Any], Any]: ...


class Event(Generic[P]):
    """An event made from a function whose body validates the arguments.

    Calling it runs the function with the same arguments (an exception
    propagates and nothing is published), then publishes the event and
    returns its id once the broker confirmed it. It keeps the function's
    name, docstring and signature. Arguments travel by their parameters'
    names (a handler may list them in any order), checked against the
    function's plain annotations and for JSON first
    (:mod:`amqp_events.core.arguments`). With a ``key`` (an
    argument's name, or a callable given the same arguments), each fire
    carries that argument's value as the event's key.
    """

    def __init__(
        self,
        app: Fires,
        name: str,
        validate: Callable[P, Any],
        wire_format: str | None = None,
        key: EventKey | None = None,
    ) -> None:
        functools.update_wrapper(self, validate)
        self.app = app
        self.name = name
        self.validate = validate
        self._signature = inspect.signature(validate)
        self._arguments = Arguments(self._signature)
        #: "celery", "cloudevents", or ``None``: the app's ``amqp_events_wire_format``.
        self.wire_format = wire_format
        #: The argument (or the callable) that gives each fire's key; ``None``: fired without a key.
        self.key = key
        if isinstance(key, str) and key not in self._signature.parameters:
            raise ValueError(f"event {name!r}: key={key!r} is not an argument of {validate.__qualname__}")

    def handler(self, target: Any = None, *, bind: bool = False) -> Any:
        """``@invoice_paid.handler`` (or ``.handler(bind=True)``): this service's handler of this event, as
        0.1.0 wrote it; the same as ``@app.handler(invoice_paid.name, bind=...)``."""
        register = self.app.handler(self.name, bind=bind)
        return register if target is None else register(target)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> str:
        return self.fire(args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("delay", "apply_async", "s", "si", "signature"):  # Celery's ways of calling a task
            raise AttributeError(
                f"{self.name!r} is an event, not a task: fire it by calling it ({self.__name__}(...)), or with "
                f".fire(args, kwargs, countdown=..., eta=...) to delay it on the broker"
            )
        raise AttributeError(name)

    def fire(
        self,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        countdown: float | None = None,
        eta: datetime | None = None,
    ) -> str:
        """Like calling the event, with Celery-style delay options.

        ``countdown`` (seconds) or ``eta`` (a datetime) make the event wait on
        the broker before it reaches its subscribers (whole seconds, never early).
        """
        args, kwargs, key = self._checked(args, kwargs or {})
        return self.app.fire(
            self.name, args, kwargs, countdown=countdown, eta=eta, wire_format=self.wire_format, key=key
        )

    async def fire_async(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Calling the event, from a coroutine: validated as a call is, then published without blocking the
        event loop; returns the event's id once the broker confirmed it (see ``app.fire_async``)."""
        checked, named, key = self._checked(args, kwargs)
        return await self.app.fire_async(self.name, checked, named, wire_format=self.wire_format, key=key)

    def _checked(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
        """Validate a fire's arguments; the positional and keyword arguments it travels with (by name when
        they have names), and its key."""
        self.validate(*args, **kwargs)
        key = self.key_of(args, kwargs)
        named = self._arguments.by_name(args, kwargs)
        if named is None:  # values of *args: they have no names, and travel by position
            if self.app.wire_format(self.wire_format) == "cloudevents":
                raise TypeError(f"event {self.name!r}: *args have no names; a CloudEvent's data is an object")
            self._arguments.check(self.name, kwargs)
            return args, kwargs, key
        self._arguments.check(self.name, named)
        return (), named, key

    def key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The key of a fire with these arguments (``None`` for an event without a key)."""
        if self.key is None:
            return None
        if callable(self.key):
            return self.key(*args, **kwargs)
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments[self.key]

    def __repr__(self) -> str:
        return f"<Event {self.name!r} of service {self.app.service!r}>"


def event_class(app: Fires, name: str, cls: C, wire_format: str | None = None, key: EventKey | None = None) -> C:
    """A fireable subclass of a dataclass or pydantic model: ``Cls(...).fire()`` publishes its fields.

    Constructing the instance is the validation. The subclass has the same
    name and an ``event_name`` attribute, and can be given to ``@app.handler``
    so that the handler receives an instance instead of keyword arguments.
    The class itself is left as it is, so that a producer and a consumer
    (two apps) can each make their own event of one shared class. ``key``
    is a field's name, or a callable given the instance.
    """
    payload = _payload_of(cls)
    if isinstance(key, str) and key not in field_names(cls):
        raise ValueError(f"event {name!r}: key={key!r} is not a field of {cls.__qualname__}")

    def key_of(instance: Any) -> Any:
        if key is None:
            return None
        return key(instance) if callable(key) else getattr(instance, key)

    def fire(self: Any, *, countdown: float | None = None, eta: datetime | None = None) -> str:
        """Publish this event; returns its id once the broker confirmed it."""
        return app.fire(
            name, (), payload(self), countdown=countdown, eta=eta, wire_format=wire_format, key=key_of(self)
        )

    async def fire_async(self: Any, *, countdown: float | None = None, eta: datetime | None = None) -> str:
        """:meth:`fire` from a coroutine, never blocking its event loop."""
        return await app.fire_async(
            name, (), payload(self), countdown=countdown, eta=eta, wire_format=wire_format, key=key_of(self)
        )

    namespace = {
        # not fields: pydantic asks
        "__annotations__": {
            "event_name": ClassVar[str],
            "event_app": ClassVar[Any],
            "event_wire_format": ClassVar[Any],
            "event_key": ClassVar[Any],
        },
        "fire": fire,
        "fire_async": fire_async,
        "event_name": name,
        "event_app": app,
        "event_wire_format": wire_format,
        "event_key": key,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
    }
    return type(cls)(cls.__name__, (cls,), namespace)


def _payload_of(cls: type) -> Callable[[Any], dict[str, Any]]:
    if dataclasses.is_dataclass(cls):
        return dataclasses.asdict
    if callable(getattr(cls, "model_dump", None)) and hasattr(cls, "model_validate"):
        return _pydantic_payload
    raise TypeError(f"@app.event on a class needs a dataclass or a pydantic model, not {cls.__qualname__}")


def field_names(cls: type) -> set[str]:
    """The fields of a dataclass or pydantic model: an event's payload."""
    if dataclasses.is_dataclass(cls):
        return {field.name for field in dataclasses.fields(cls)}
    return set(getattr(cls, "model_fields", {}))


def _pydantic_payload(instance: Any) -> dict[str, Any]:
    # JSON mode turns UUIDs, datetimes and nested models into plain JSON values.
    return dict(instance.model_dump(mode="json"))


def argument_names(fireable: Any) -> tuple[str, ...]:
    """The names of a declared event's arguments (what ``@app.event`` made), in order."""
    if isinstance(fireable, Event):
        return tuple(fireable._signature.parameters)
    return tuple(sorted(field_names(fireable))) if isinstance(fireable, type) else ()


def argument_annotations(fireable: Any) -> dict[str, Any]:
    """The annotation of each argument (or field) of a declared event, as written (a string under
    ``from __future__ import annotations``)."""
    if isinstance(fireable, Event):
        return {name: parameter.annotation for name, parameter in fireable._signature.parameters.items()}
    if dataclasses.is_dataclass(fireable):
        return {field.name: field.type for field in dataclasses.fields(fireable)}
    return {name: field.annotation for name, field in getattr(fireable, "model_fields", {}).items()}
