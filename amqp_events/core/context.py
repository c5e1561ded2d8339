"""What the core works from: a service's context, and the middleware hooks around firing and handling.

:class:`ServiceContext` is everything the core needs of one service: its
name, settings, handlers, transport, clock and middleware. It is frozen: the
app makes a new one when something changes (a handler registered, the
in-process mode switching the app to its broker in memory).

:class:`Middleware`, in dramatiq's sense: an ordered list of objects with
named hooks around firing, handling and replaying (documented on the class).
Tracing, metrics, structured logs, circuit breakers, the inbox, reading
CloudEvents and the in-process mode's records are middleware, and users add
their own (``app.add_middleware``). ``before_*`` hooks run in list order,
``after_*`` hooks in reverse order; a hook a middleware does not override
costs nothing (:class:`Middlewares` keeps, per hook, only the overriding ones).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from types import MappingProxyType
from typing import Any, TypeVar

from amqp_events.clock import Clock
from amqp_events.core.delivery import Delivery, Received
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Handling, Outcome
from amqp_events.core.policy import RetryPolicy
from amqp_events.coroutines import complete, is_coroutine_handler
from amqp_events.settings import Settings
from amqp_events.topology import Topology, delays, service_topology
from amqp_events.topology.names import dead_letter_exchange_name, is_partition_queue
from amqp_events.transport.base import Transport
from amqp_events.wire.message import OutgoingMessage
from amqp_events.wire.trust import Identity

M = TypeVar("M", bound="Middleware")
#: A handler's call as middleware see it: the attempt, the positional and the keyword arguments.
HandlerCall = Callable[["Attempt", tuple[Any, ...], dict[str, Any]], Any]


class Attempt:
    """One message taken by a service's worker, from the moment it is taken to its settled outcome.

    ``kind`` is ``run`` (its handler runs, or a middleware skips it), ``lost``
    (the pool process running it died) or ``refused`` (no handler can take
    it: ``handler`` is ``None``). Middleware keep what they need between their
    hooks in ``state``.
    """

    __slots__ = ("arguments", "call", "can_hold", "concluded", "context", "delivery", "handler", "kind", "state")

    def __init__(
        self,
        context: ServiceContext,
        delivery: Delivery,
        handler: Handler | None,
        kind: str,
        call: Callable[..., Any] | None = None,
        can_hold: bool = False,
    ) -> None:
        self.context, self.delivery, self.handler, self.kind = context, delivery, handler, kind
        #: Can the worker running it keep it unsettled and run it again later (a :class:`~amqp_events.core.outcome.
        #: Hold`)? Celery's own request path cannot: a prefork child gives every message back settled.
        self.can_hold = can_hold
        #: The handler's own function (``run`` attempts): what the innermost :data:`HandlerCall` calls.
        self.call = call
        #: The keyword arguments the handler is called with, when a ``before_handle`` hook made them (an earlier
        #: version's upcast); ``None``: the delivery's. The delivery, what a retry or an archived copy carries, stays.
        self.arguments: dict[str, Any] | None = None
        self.state: dict[str, Any] = {}
        #: The outcome settled already while the handler ran (by ``self.retry()``).
        self.concluded: Outcome | None = None


class Firing:
    """One event being fired: published with a confirm, sent in a batch, or written to the outbox."""

    __slots__ = ("batched", "context", "delay", "message", "state")

    def __init__(self, context: ServiceContext, message: OutgoingMessage, delay: int, batched: bool) -> None:
        #: ``message`` reaches the subscribers' queues after ``delay`` seconds.
        self.context, self.message, self.delay, self.batched = context, message, delay, batched
        self.state: dict[str, Any] = {}


class Replay:
    """One archived message being sent back to its queue by an operator."""

    __slots__ = ("archived_headers", "by", "context", "message", "state")

    def __init__(
        self, context: ServiceContext, message: OutgoingMessage, archived_headers: Mapping[str, Any], by: str
    ) -> None:
        #: ``message`` is the replayed copy; ``archived_headers`` those of the archived one; ``by`` who replays.
        self.context, self.message, self.archived_headers, self.by = context, message, archived_headers, by
        self.state: dict[str, Any] = {}


class Middleware:
    """Base class of middleware: every hook does nothing; override those you need.

    Firing (in the process that fires):

    * ``before_fire(firing)``: the message is built; replace ``firing.message`` to change it.
    * ``after_fire(firing, result, error)``: ``result`` is ``confirmed``, ``unroutable`` (no queue
      took it), ``outbox`` (a row written) or ``error``; in a batch, once its confirm came.

    Handling (in the worker; a prefork worker's pool process for ``before_handle`` to ``after_handle``):

    * ``before_receive(context, received) -> Received``: a message as it arrived, before anything
      decodes it; return it changed, or raise :class:`~amqp_events.errors.Refused` to archive it as is.
    * ``before_handle(attempt) -> Outcome | None``: before the handler runs; an outcome skips the run.
    * ``wrap_run(context, handler, run) -> run``: once per handler: wrap its call (the inbox's transaction).
    * ``optional_failed(attempt, section, error)``: an ``optional()`` section swallowed ``error``.
    * ``before_settle(attempt, outcome) -> Outcome``: the outcome is decided; return it (or a copy with
      more headers) before its copy is published.
    * ``after_handle(attempt, outcome, error)``: every message taken ends here, once: its outcome
      settled, or ``error`` when settling it failed (the message then goes back to the broker unacked).

    Operating:

    * ``before_replay(replay)`` / ``after_replay(replay, error)``: around sending an archived message back.

    Any hook may be a coroutine function (``async def``): in a worker it is awaited on the
    worker's event loop, where coroutine handlers run, so that it may share their clients (an async database
    engine, ``httpx.AsyncClient``); elsewhere on a loop of the calling thread.
    """

    @classmethod
    def for_service(cls, settings: Settings, handlers: Sequence[Handler], version: str) -> Middleware | None:
        """The middleware of this kind a service with ``settings`` and ``handlers`` gets (``None``: none): the
        library's own say when they are wanted (:mod:`amqp_events.features` lists them)."""
        return cls()

    def before_fire(self, firing: Firing) -> None:
        return None

    def after_fire(self, firing: Firing, result: str, error: BaseException | None) -> None:
        return None

    def before_receive(self, context: ServiceContext, received: Received) -> Received:
        return received

    def before_handle(self, attempt: Attempt) -> Outcome | None:
        return None

    def wrap_run(self, context: ServiceContext, handler: Handler, run: HandlerCall) -> HandlerCall:
        return run

    def optional_failed(self, attempt: Attempt, section: str, error: BaseException) -> None:
        return None

    def before_settle(self, attempt: Attempt, outcome: Outcome) -> Outcome:
        return outcome

    def after_handle(self, attempt: Attempt, outcome: Outcome | None, error: BaseException | None) -> None:
        return None

    def before_replay(self, replay: Replay) -> None:
        return None

    def after_replay(self, replay: Replay, error: BaseException | None) -> None:
        return None


HOOKS = (
    "before_fire",
    "after_fire",
    "before_receive",
    "before_handle",
    "wrap_run",
    "optional_failed",
    "before_settle",
    "after_handle",
    "before_replay",
    "after_replay",
)


class Middlewares:
    """An ordered list of middleware, and for each hook the bound methods that override it.

    ``after_*`` hooks are kept in reverse order: the first middleware is the outermost.
    """

    def __init__(self, items: Iterable[Middleware] = ()) -> None:
        self.items: tuple[Middleware, ...] = tuple(items)
        for hook in HOOKS:
            methods = [
                _awaited(getattr(item, hook)) if is_async else getattr(item, hook)
                for item in self.items
                if (is_async := _overridden(type(item)).get(hook)) is not None
            ]
            if hook.startswith("after_"):
                methods.reverse()
            setattr(self, hook, tuple(methods))

    # The hooks' overriding methods (set in __init__), for the type checker.
    before_fire: tuple[Callable[[Firing], None], ...]
    after_fire: tuple[Callable[[Firing, str, BaseException | None], None], ...]
    before_receive: tuple[Callable[[ServiceContext, Received], Received], ...]
    before_handle: tuple[Callable[[Attempt], Outcome | None], ...]
    wrap_run: tuple[Callable[[ServiceContext, Handler, HandlerCall], HandlerCall], ...]
    optional_failed: tuple[Callable[[Attempt, str, BaseException], None], ...]
    before_settle: tuple[Callable[[Attempt, Outcome], Outcome], ...]
    after_handle: tuple[Callable[[Attempt, Outcome | None, BaseException | None], None], ...]
    before_replay: tuple[Callable[[Replay], None], ...]
    after_replay: tuple[Callable[[Replay, BaseException | None], None], ...]

    def find(self, kind: type[M]) -> M | None:
        """The first middleware of ``kind``, if any."""
        return next((item for item in self.items if isinstance(item, kind)), None)

    def __add__(self, more: Iterable[Middleware]) -> Middlewares:
        return Middlewares((*self.items, *more))


_OVERRIDDEN: dict[type[Middleware], dict[str, bool]] = {}


def _overridden(kind: type[Middleware]) -> dict[str, bool]:
    """The hooks a middleware class overrides, each with whether it is an ``async def`` one; found once (a
    service's middleware are listed again for each in-process run)."""
    found = _OVERRIDDEN.get(kind)
    if found is None:
        found = _OVERRIDDEN[kind] = {
            hook: is_coroutine_handler(getattr(kind, hook))
            for hook in HOOKS
            if getattr(kind, hook, None) is not getattr(Middleware, hook)
        }
    return found


def _awaited(method: Callable[..., Any]) -> Callable[..., Any]:
    """An ``async def`` hook as the pipeline calls it: awaited to completion (see :class:`Middleware`)."""

    @functools.wraps(method)
    def awaited(*args: Any) -> Any:
        return complete(method(*args))

    return awaited


@dataclass(frozen=True, eq=False)
class ServiceContext:
    """One service as the core sees it. The app builds it (:attr:`amqp_events.celery.EventsApp.context`)."""

    name: str
    settings: Settings
    #: The service's handlers, by their task name (:attr:`Handler.task_name`: the event each handles, and
    #: ``<event>:<name>`` for a named one).
    handlers: Mapping[str, Handler]
    transport: Transport
    clock: Clock
    middleware: Middlewares = field(default_factory=Middlewares)
    #: Exceptions the host's runtime steers a handler with (Celery's ``Retry``, ``Ignore``, ``Reject``): they
    #: pass through the handling pipeline untouched.
    control_flow: tuple[type[BaseException], ...] = ()
    #: The version each event it declares is fired at (``@app.event(..., version=N)``; not named: 1).
    event_versions: Mapping[str, int] = field(default_factory=dict)
    #: The rules each handler (and ``None``: a message no handler takes) runs by, worked out when it is made.
    _rules: Mapping[Handler | None, Handling] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        # Every handler's rules worked out now (the app's retry rules checked now, not at the first failure).
        rules = {handler: self._rules_of(handler) for handler in (None, *self.handlers.values())}
        object.__setattr__(self, "_rules", MappingProxyType(rules))

    def now(self) -> datetime:
        return self.clock.now()

    @cached_property
    def _takers(self) -> Mapping[str, tuple[Handler, ...]]:
        by_queue: dict[str, tuple[Handler, ...]] = {}
        for handler in self.handlers.values():
            by_queue[handler.queue] = (*by_queue.get(handler.queue, ()), handler)
        return by_queue

    def takers(self, queue: str) -> tuple[Handler, ...]:
        """The handlers that take their events from ``queue`` (a service queue is shared by all its unordered
        handlers, a partition by all its ordered ones)."""
        found = self._takers.get(queue)
        if found is None and is_partition_queue(queue, self.name):
            found = tuple(handler for handler in self.handlers.values() if handler.ordered)
        return found or ()

    @cached_property
    def dead_letter_exchange(self) -> str:
        """Where its queues dead-letter: what comes back through it was dead-lettered by the broker."""
        return dead_letter_exchange_name(self.name)

    @cached_property
    def identity(self) -> Identity:
        """Who this service is on its broker: what the ``user_id`` of a message it takes means to it."""
        settings = self.settings
        return Identity(self.name, self.transport.user, settings.service_users, frozenset(settings.trusted_users))

    @cached_property
    def topology(self) -> Topology:
        """This service's exchanges, queues and bindings (computed, not read from the broker)."""
        ordered = [event for event, handler in self.handlers.items() if handler.ordered]
        return service_topology(self.name, self.handlers, self.settings, ordered)

    def handling(self, handler: Handler | None) -> Handling:
        """The rules ``handler`` runs by (the app's for a message no handler takes)."""
        found = self._rules.get(handler)
        return found if found is not None else self._rules_of(handler)

    def _rules_of(self, handler: Handler | None) -> Handling:
        options = dict(handler.retry_options) if handler is not None else {}
        return Handling(
            self.name,
            handler.name if handler is not None else "",
            RetryPolicy.from_settings(self.settings, **options),
            self.settings.max_deliveries,
            self.settings.max_redeliveries,
            handler.task_name if handler is not None else "",
            delays.own_entry(self.name) if self.settings.delay_ladder == "per_service" else delays.ENTRY_EXCHANGE,
        )
