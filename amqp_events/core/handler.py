"""A service's handler of one event, as the core sees it: what it is called, where its messages wait,
which arguments it takes and which rules and options it has. How it is run (a Celery task) is the adapter's
business (:mod:`amqp_events.celery.task`)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from amqp_events.core.events import field_names
from amqp_events.errors import BadArguments
from amqp_events.inbox.base import DedupStore, TransactionalInbox

#: ``max_retries``/``backoff_base``/``backoff_max``/``jitter``/``dont_retry``: a handler's own retry rules.
RETRY_OPTIONS = ("max_retries", "backoff_base", "backoff_max", "jitter", "dont_retry")
#: What an ordered handler's archived event does to the later events of its key.
ON_ARCHIVE = ("park", "skip")


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
    #: The same-transaction inbox: the handler's first argument is its handle.
    inbox: TransactionalInbox | None = None
    #: The store of effects done, consulted before and recorded after a run.
    dedup: DedupStore | None = None
    #: Its circuit breaker: a policy, a dict of policy fields, True/False, or None for the app's default.
    breaker: Any = None
    #: Names of the health checks it requires.
    requires: tuple[str, ...] = ()
    #: Its events are handled one at a time per key, in order: the name of the argument (of the field, for
    #: class events) that holds the key, or a callable given the event's arguments; ``None``: unordered.
    ordered_by: str | Callable[..., Any] | None = None
    #: An ordered handler's archived event: ``park`` its key (the key's later events wait until the archived one
    #: is replayed or discarded) or ``skip`` it (they go on).
    on_archive: str = "park"

    def __post_init__(self) -> None:
        unknown = set(self.retry_options) - set(RETRY_OPTIONS)
        if unknown:
            raise TypeError(f"{self.name}: unknown retry option(s) {', '.join(sorted(unknown))}")
        if self.on_archive not in ON_ARCHIVE:
            raise TypeError(f"{self.name}: on_archive={self.on_archive!r} is not one of {', '.join(ON_ARCHIVE)}")
        if isinstance(self.ordered_by, str) and self.ordered_by not in self._payload_names():
            raise TypeError(f"{self.name}: ordered_by={self.ordered_by!r} is not one of its event's arguments")
        if self.inbox is not None and not self._takes_a_handle():
            raise TypeError(
                f"{self.name} has an inbox, so it receives the inbox's session or connection as its first "
                "argument: add a parameter for it, e.g. def handler(session, ...)"
            )

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
        return int(self.takes_self) + int(self.inbox is not None)

    @property
    def short_name(self) -> str:
        """The function's or class's own name, without its module."""
        return self.name.rsplit(".", 1)[-1]

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
        return self.ordered_by is not None

    @property
    def parks(self) -> bool:
        """Does an archived event of this handler park its key?"""
        return self.ordered and self.on_archive == "park"

    def key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The key of an event with these arguments, as ``ordered_by`` says (:class:`~amqp_events.BadArguments`
        when they do not give one)."""
        ordered_by = self.ordered_by
        try:
            if callable(ordered_by):
                return ordered_by(*args, **kwargs)
            if self.event_class is not None:
                return kwargs[str(ordered_by)]
            handle = () if self.inbox is None else (None,)
            return self.signature.bind(*handle, *args, **kwargs).arguments[str(ordered_by)]
        except Exception as exc:
            raise BadArguments(f"{self.name}: no key ({ordered_by!r}) in this payload: {exc!r}") from exc

    @cached_property
    def argument_names(self) -> tuple[str, ...]:
        """The names of its event's arguments, in order (without the inbox's handle)."""
        if self.event_class is not None:
            return tuple(field_names(self.event_class))
        return tuple(list(self.signature.parameters)[int(self.inbox is not None) :])

    def _payload_names(self) -> set[str]:
        return set(self.argument_names)

    def _takes_a_handle(self) -> bool:
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        parameters = list(self.signature.parameters.values())
        return bool(parameters) and parameters[0].kind in (*positional, inspect.Parameter.VAR_POSITIONAL)


@functools.lru_cache(maxsize=4096)
def _refusal(handler: Handler, positional: int, keywords: frozenset[str]) -> str | None:
    """Why ``handler`` cannot take arguments of this shape, or None: whether they bind depends on their shape
    only, so each shape is tried once (with placeholders)."""
    handle = () if handler.inbox is None else (None,)
    try:
        handler.signature.bind(*handle, *(None,) * positional, **dict.fromkeys(keywords))
    except TypeError as exc:
        return str(exc)
    return None
