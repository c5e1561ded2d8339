"""A service's handler of one event, as the core sees it: what it is called, where its messages wait,
which arguments it takes and which rules and options it has. How it is run (a Celery task) is the adapter's
business (:mod:`amqp_events.celery.task`)."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypedDict

from amqp_events.core.events import field_names
from amqp_events.errors import BadArguments


class RetryOptions(TypedDict, total=False):
    """``@app.handler``'s own retry rules (the others are the app's settings)."""

    max_retries: int | None
    backoff_base: float | None
    backoff_max: float | None
    jitter: bool | None
    #: Exception types archived at once (``non_retryable``).
    dont_retry: tuple[type[BaseException], ...]


RETRY_OPTIONS = tuple(RetryOptions.__annotations__)


@dataclass(frozen=True, eq=False)
class Handler:
    """One handler of one service (``@app.handler(event)``)."""

    #: The event it handles.
    event: str
    #: The function or class registered, as ``module.qualname``: its name in logs, metrics and the archive.
    name: str
    #: The queue its messages come in: the service's queue of the event, where they (and their retries) wait;
    #: for an ordered handler, the service's intake (its messages then wait in the service's partitions).
    queue: str
    #: The registered function (or a class-based handler's ``run``), as written.
    function: Callable[..., Any]
    #: Its first parameter is ``self`` (``bind=True``, or a class-based handler's ``run``).
    takes_self: bool = False
    #: For handlers of class events: the payload is turned into this class before the call.
    event_class: type | None = None
    #: Its own retry rules (keys of :data:`RETRY_OPTIONS`); the others are the app's.
    retry_options: Mapping[str, Any] = field(default_factory=dict)
    #: The options of the features that declared them (:mod:`amqp_events.core.options`), by name: each
    #: feature reads its own (``handler.options["inbox"]``).
    options: Mapping[str, Any] = field(default_factory=dict)
    #: A middleware hands it its first argument (an inbox's session or connection), before the payload's.
    handle_first: bool = False
    #: Its events are handled one at a time per key, in order: their key, from the event's arguments
    #: (:class:`~amqp_events.BadArguments` when they give none); ``None``: unordered.
    key: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None = None
    #: An archived event of this (ordered) handler parks its key: the key's later events wait for it.
    parks: bool = False
    #: The name it was registered with (``@app.handler(event, name="welcome_email")``), beside other handlers
    #: of its event in its service; ``None``: the event's one unnamed handler.
    label: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.retry_options) - set(RETRY_OPTIONS)
        if unknown:
            raise TypeError(f"{self.name}: unknown retry option(s) {', '.join(sorted(unknown))}")

    @cached_property
    def signature(self) -> inspect.Signature:
        """What a call takes, without ``self``: the inbox's handle first, when it has an inbox."""
        signature = inspect.signature(self.function)
        if self.takes_self:
            signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        return signature

    @property
    def leading_parameters(self) -> int:
        """Parameters before the payload's: ``self``, the inbox's handle."""
        return int(self.takes_self) + int(self.handle_first)

    @property
    def task_name(self) -> str:
        """Its task, and the ``task`` header of the copies sent to it alone (:func:`~amqp_events.topology.names.
        task_name`): how the service's handlers are told apart."""
        return self.event if self.label is None else f"{self.event}:{self.label}"

    @property
    def short_name(self) -> str:
        """The function's or class's own name, without its module."""
        return self.name.rsplit(".", 1)[-1]

    def known_as(self, name: str) -> bool:
        """Whether an operator's ``name`` means this handler: its function's name, its full name, its event, or the
        name it was registered with."""
        return name in (self.name, self.short_name, self.event, self.task_name, self.label)

    def fit(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's arguments for a payload (an instance of the event class, for class events);
        :class:`~amqp_events.BadArguments` when the payload does not fit."""
        if self.event_class is not None:
            try:
                return (self.event_class(*args, **kwargs),), {}
            except Exception as exc:
                raise BadArguments(f"cannot build {self.event_class.__name__} from the payload: {exc}") from exc
        refused = _refusal(self, len(args), frozenset(kwargs))
        if refused is not None:
            raise BadArguments(f"{self.name}{self.signature} cannot take this payload: {refused}")
        return args, kwargs

    @property
    def ordered(self) -> bool:
        return self.key is not None

    def key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The key of an event with these arguments (:class:`~amqp_events.BadArguments` when they give none)."""
        assert self.key is not None, f"{self.name} is not ordered"
        return self.key(args, kwargs)

    @cached_property
    def argument_names(self) -> tuple[str, ...]:
        """The names of its event's arguments, in order (without the inbox's handle)."""
        if self.event_class is not None:
            return tuple(field_names(self.event_class))
        return tuple(list(self.signature.parameters)[int(self.handle_first) :])

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments:
        """The payload bound to its parameters (``TypeError`` when it does not fit), the handle left out."""
        handle = (None,) if self.handle_first else ()
        bound = self.signature.bind(*handle, *args, **kwargs)
        if self.handle_first:
            bound.arguments.pop(next(iter(self.signature.parameters)), None)
        return bound


@functools.lru_cache(maxsize=4096)
def _refusal(handler: Handler, positional: int, keywords: frozenset[str]) -> str | None:
    """Why ``handler`` cannot take arguments of this shape, or None: whether they bind depends on their shape
    only, so each shape is tried once (with placeholders)."""
    try:
        handler.bind((None,) * positional, dict.fromkeys(keywords))
    except TypeError as exc:
        # Names only (the values are placeholders), unquoted: the archive's grouping masks quoted values.
        return re.sub(r"'([A-Za-z_]\w*)'", r"\1", str(exc))
    return None


#: Where an option finds an event's key: the name of one of its arguments, or a callable given them all.
KeyOption = str | Callable[..., Any]


def argument_key(handler: Handler, option: str, by: KeyOption) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """The key an event's arguments give, as ``option=by`` of ``handler`` says (``ordered_by=``,
    ``concurrency_key=``): ``TypeError`` now for a name that is not one of its arguments, and
    :class:`~amqp_events.BadArguments` for a payload that gives none."""
    if not callable(by) and by not in handler.argument_names:
        raise TypeError(f"{handler.name}: {option}={by!r} is not one of its event's arguments")

    def key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            if callable(by):
                return by(*args, **kwargs)
            if handler.event_class is not None:  # a class event's payload is its fields, by name
                return kwargs[by]
            return handler.bind(args, kwargs).arguments[by]
        except Exception as exc:
            raise BadArguments(f"{handler.name}: no key ({by!r}) in this payload: {exc!r}") from exc

    return key
