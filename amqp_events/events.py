"""Fireable events: what ``@app.event`` turns a function or a class into."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Generic, ParamSpec, TypeVar

from amqp_events.errors import PublishError, TopologyMissing
from amqp_events.message import OutgoingMessage
from amqp_events.metrics import record_fired

if TYPE_CHECKING:
    from amqp_events.app import EventsApp

logger = logging.getLogger(__name__)

P = ParamSpec("P")
C = TypeVar("C", bound=type)


class Event(Generic[P]):
    """An event made from a function whose body validates the arguments.

    Calling it runs the function with the same arguments (an exception
    propagates and nothing is published), then publishes the event and
    returns its id once the broker confirmed it. It keeps the function's
    name, docstring and signature. Fired as a CloudEvent, positional
    arguments travel under their parameters' names.
    """

    def __init__(self, app: EventsApp, name: str, validate: Callable[P, Any], wire_format: str | None = None) -> None:
        functools.update_wrapper(self, validate)
        self.app = app
        self.name = name
        self.validate = validate
        #: "celery", "cloudevents", or ``None``: the app's ``amqp_events_wire_format``.
        self.wire_format = wire_format

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> str:
        return self.fire(args, kwargs)

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
        kwargs = kwargs or {}
        self.validate(*args, **kwargs)
        if args and self.app.wire_format(self.wire_format) == "cloudevents":
            args, kwargs = (), keyword_arguments(self.validate, args, kwargs)
        return self.app.fire(self.name, args, kwargs, countdown=countdown, eta=eta, wire_format=self.wire_format)

    def __repr__(self) -> str:
        return f"<Event {self.name!r} of service {self.app.service!r}>"


def keyword_arguments(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``args`` and ``kwargs`` of a call of ``function``, all by name (a CloudEvent's data is an object)."""
    signature = inspect.signature(function)
    named: dict[str, Any] = {}
    for parameter, value in signature.bind(*args, **kwargs).arguments.items():
        kind = signature.parameters[parameter].kind
        if kind is inspect.Parameter.VAR_POSITIONAL and value:
            raise TypeError(f"*{parameter} has no names: it cannot travel in a CloudEvent's data")
        if kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            named[parameter] = value
    return named


def event_class(app: EventsApp, name: str, cls: C, wire_format: str | None = None) -> C:
    """A fireable subclass of a dataclass or pydantic model: ``Cls(...).fire()`` publishes its fields.

    Constructing the instance is the validation. The subclass has the same
    name and an ``event_name`` attribute, and can be given to ``@app.handler``
    so that the handler receives an instance instead of keyword arguments.
    The class itself is left as it is, so that a producer and a consumer
    (two apps) can each make their own event of one shared class.
    """
    payload = _payload_of(cls)

    def fire(self: Any, *, countdown: float | None = None, eta: datetime | None = None) -> str:
        """Publish this event; returns its id once the broker confirmed it."""
        return app.fire(name, (), payload(self), countdown=countdown, eta=eta, wire_format=wire_format)

    namespace = {
        # not fields: pydantic asks
        "__annotations__": {
            "event_name": ClassVar[str],
            "event_app": ClassVar[Any],
            "event_wire_format": ClassVar[Any],
        },
        "fire": fire,
        "event_name": name,
        "event_app": app,
        "event_wire_format": wire_format,
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


def _pydantic_payload(instance: Any) -> dict[str, Any]:
    # JSON mode turns UUIDs, datetimes and nested models into plain JSON values.
    return dict(instance.model_dump(mode="json"))


class EventBatch:
    """The events fired inside ``with app.batch():`` (see :meth:`EventsApp.batch`)."""

    def __init__(self, app: EventsApp, window: int) -> None:
        self.app = app
        self._publisher = app.transport.batch(window)
        #: Ids of the events fired in the block, in order.
        self.ids: list[str] = []
        self._names: list[str] = []
        self._delayed: set[str] = set()

    def publish(self, message: OutgoingMessage) -> None:
        self._publisher.publish(message)
        self.ids.append(message.message_id)
        self._names.append(message.event)
        if message.delayed:
            self._delayed.add(message.message_id)

    def finish(self) -> None:
        """Wait for every confirm; raise for anything the broker refused or could not route."""
        self._publisher.wait()
        _, refused, returned = self._publisher.results()
        for event_id, name in zip(self.ids, self._names, strict=True):
            result = "error" if event_id in refused else "unroutable" if event_id in returned else "confirmed"
            record_fired(self.app.service, name, result)
        if refused:
            raise PublishError(f"the broker refused {len(refused)} event(s): {refused}", refused)
        lost_delays = self._delayed & returned
        if lost_delays:
            raise TopologyMissing(f"{len(lost_delays)} delayed event(s) found no delay queue: {sorted(lost_delays)}")
        unrouted = len(returned)
        if unrouted:
            logger.debug("fired %d event(s) in a batch that no service subscribes to", unrouted)

    def close(self) -> None:
        self._publisher.close()
