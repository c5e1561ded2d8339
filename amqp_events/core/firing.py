"""Firing: an event's message built, through the middleware, and onto the broker with a confirm.

:func:`fire` publishes at once unless a *sink* of the service is open in the
caller's context: a :class:`Batch` (``with app.batch():``, confirms collected
together) or the transactional outbox (``with app.outbox(...):``, a row in the
application's transaction, :mod:`amqp_events.outbox.writer`). Each fired
event passes the ``before_fire`` hooks once it is built and the
``after_fire`` hooks once its fate is known.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from amqp_events.core.context import Firing, ServiceContext
from amqp_events.core.events import FireOptions
from amqp_events.errors import NotOwner, PublishError, TopologyMissing
from amqp_events.topology import check_event_name, delays
from amqp_events.topology.names import slot_of
from amqp_events.topology.ownership import owner_of_event, owns
from amqp_events.wire import cloud_events
from amqp_events.wire.message import EVENT_SLOT, EVENT_VERSION, OutgoingMessage, event_envelope, event_key, new_event_id

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11

logger = logging.getLogger(__name__)

_NO_LADDER = (
    "cannot delay {event!r}: the delay ladder is not on the broker yet. Start a worker of any service, "
    "or run `amqp-events -A <app> topology declare`."
)


class Sink(Protocol):
    """Where a service's fired events go, instead of straight to the broker, while a block is open."""

    #: The service whose events it takes.
    service: str

    def take(self, firing: Firing) -> None:
        """Take one fired event; its ``after_fire`` hooks run once its fate is known."""

    def batch(self) -> AbstractContextManager[Any]:
        """What ``with app.batch():`` gives inside this block."""


#: The sinks open in this context, innermost last.
_open_sinks: ContextVar[tuple[Sink, ...]] = ContextVar("amqp_events_sinks", default=())


#: ``(service, event)`` of each event fired with no subscriber yet: its first time is a warning, later ones debug.
_UNROUTABLE: set[tuple[str, str]] = set()


def open_sink(service: str) -> Sink | None:
    """The innermost sink open for ``service`` in this context, if any."""
    for sink in reversed(_open_sinks.get()):
        if sink.service == service:
            return sink
    return None


@contextmanager
def sending_to(sink: Sink) -> Iterator[Sink]:
    """Inside the block (in this context), the events ``sink.service`` fires go to ``sink``."""
    token = _open_sinks.set((*_open_sinks.get(), sink))
    try:
        yield sink
    finally:
        _open_sinks.reset(token)


def fire(
    context: ServiceContext,
    event: str,
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: dict[str, Any] | None = None,
    **options: Unpack[FireOptions],
) -> str:
    """Fire ``event`` (no validation) and return its id: once the broker confirmed it, or once an open sink
    took it (see :meth:`amqp_events.celery.EventsApp.fire`)."""
    sink = open_sink(context.name)
    firing = _built(context, sink, event, args, kwargs, **options)
    if sink is not None:
        sink.take(firing)
        return firing.message.message_id
    message = delayed(context, firing.message, firing.delay)
    try:
        routed = context.transport.publish(message)
    except Exception as exc:
        _failed(firing, exc)
    return _published(firing, message, routed)


async def fire_async(
    context: ServiceContext,
    event: str,
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: dict[str, Any] | None = None,
    **options: Unpack[FireOptions],
) -> str:
    """:func:`fire` from a coroutine: the confirm is awaited without blocking the event loop."""
    sink = open_sink(context.name)
    firing = _built(context, sink, event, args, kwargs, **options)
    if sink is not None:
        sink.take(firing)
        return firing.message.message_id
    message = delayed(context, firing.message, firing.delay)
    try:
        routed = await context.transport.publish_async(message)
    except Exception as exc:
        _failed(firing, exc)
    return _published(firing, message, routed)


def _built(
    context: ServiceContext,
    sink: Sink | None,
    event: str,
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any] | None,
    **options: Unpack[FireOptions],
) -> Firing:
    """The fired event's message, through the ``before_fire`` hooks (``sink``: where it goes instead of the
    broker, if a block is open)."""
    message, delay = fired_message(
        context, event, args, kwargs or {}, options.get("countdown"), options.get("eta"), options.get("event_id"),
        options.get("wire_format"), options.get("key"),
    )  # fmt: skip
    firing = Firing(context, message, delay, batched=isinstance(sink, Batch))
    for before in context.middleware.before_fire:
        before(firing)
    return firing


def _failed(firing: Firing, exc: Exception) -> NoReturn:
    """Publishing ``firing`` raised ``exc``: its ``after_fire`` hooks are told, and it is raised (a missing
    exchange of the delay ladder said as such)."""
    fired(firing, "error", exc)
    if isinstance(exc, TopologyMissing):
        raise TopologyMissing(_NO_LADDER.format(event=firing.message.event)) from exc
    raise exc


def _published(firing: Firing, message: OutgoingMessage, routed: bool) -> str:
    """The confirmed event's id, its ``after_fire`` hooks told; an unroutable one is logged."""
    fired(firing, "confirmed" if routed else "unroutable")
    if not routed:
        event, service = message.event, firing.context.name
        if message.delayed:
            raise TopologyMissing(f"cannot delay {event!r}: a delay queue is missing; declare the topology again")
        first = (service, event) not in _UNROUTABLE and len(_UNROUTABLE) < 10_000
        _UNROUTABLE.add((service, event))
        logger.log(
            logging.WARNING if first else logging.DEBUG,
            "fired event=%s service=%s id=%s: no service subscribes to it (nothing received it; a typo in its name?)",
            event, service, message.message_id,
        )  # fmt: skip
    return message.message_id


def fired(firing: Firing, result: str, error: BaseException | None = None) -> None:
    """The ``after_fire`` hooks of ``firing``, whose fate is ``result``."""
    for after in firing.context.middleware.after_fire:
        after(firing, result, error)


def delayed(context: ServiceContext, message: OutgoingMessage, delay: int) -> OutgoingMessage:
    """A fired message as published: through the delay ladder first when it waits ``delay`` seconds."""
    if not delay:
        return message
    return message.after(delay, delays.event_destination(message.event), context.now())


def fired_message(
    context: ServiceContext,
    event: str,
    args: Any,
    kwargs: dict[str, Any],
    countdown: float | None = None,
    eta: datetime | None = None,
    event_id: str | None = None,
    wire_format: str | None = None,
    key: Any = None,
) -> tuple[OutgoingMessage, int]:
    """The message that fires ``event`` at once, and how many seconds it must wait first (no validation of
    the arguments; ``key`` is checked by :func:`~amqp_events.wire.message.event_key`)."""
    check_event_name(event)
    if not owns(context.settings, context.name, event):
        owner = owner_of_event(event, context.settings.event_owners)
        raise NotOwner(
            f"service {context.name!r} may not fire {event!r}: with event ownership on, it is {owner!r}'s "
            "(amqp_events_event_owners can give it to another service)"
        )
    key = None if key is None else event_key(key)
    now = context.now()
    version = context.event_versions.get(event, 1)
    if (wire_format or context.settings.wire_format) == "cloudevents":
        if args:
            raise ValueError(
                f"cannot fire {event!r} as a CloudEvent with positional arguments: its data is a JSON object "
                "of keyword arguments"
            )
        message_id = new_event_id(event_id)
        headers: dict[str, Any] = cloud_events.binary_headers(event, message_id, context.name, now, key, version)
        body: Any = dict(kwargs)
    else:
        headers, body = event_envelope(event, args, kwargs, context.name, now, event_id, key)
        message_id = headers["id"]
        if version > 1:  # without it, version 1: what the releases before versions fired
            headers[EVENT_VERSION] = version
    if key is not None:  # where the ordered exchanges send it (without one, a worker works it out)
        headers[EVENT_SLOT] = slot_of(key)
    if eta is not None and countdown is None:
        countdown = delays.seconds_until(eta, now)
    message = OutgoingMessage(context.settings.exchange, event, headers, body, message_id)
    return message, delays.whole_seconds(countdown) if countdown else 0


class Batch:
    """The events fired inside ``with app.batch():``: published at once, their confirms collected together.

    When the block ends, :meth:`finish` waits for every confirm, then
    :class:`~amqp_events.PublishError` names any event the broker refused or
    did not confirm in time.
    """

    def __init__(self, context: ServiceContext, publisher: Any) -> None:
        self.context = context
        self.service = context.name
        #: A :class:`~amqp_events.transport.base.BatchPublisher` (an ``AsyncBatchPublisher`` for coroutines).
        self._publisher = publisher
        #: Ids of the events fired in the block, in order.
        self.ids: list[str] = []
        self._firings: list[Firing] = []

    def take(self, firing: Firing) -> None:
        message = delayed(firing.context, firing.message, firing.delay)
        try:
            self._publisher.publish(message)
        except Exception as exc:
            fired(firing, "error", exc)
            raise
        self.ids.append(message.message_id)
        self._firings.append(firing)

    def batch(self) -> AbstractContextManager[Any]:
        return nullcontext(self)  # a block opened inside this one joins it

    def finish(self) -> None:
        """Wait for every confirm; raise for anything the broker refused or could not route."""
        firings, self._firings = self._firings, []
        try:
            self._publisher.wait()
        except BaseException as exc:
            _all_fired(firings, exc)
            raise
        self._settle(firings)

    def _settle(self, firings: list[Firing]) -> None:
        _, refused, returned = self._publisher.results()
        refused_ids = set(refused)
        for firing in firings:
            event_id = firing.message.message_id
            if event_id in refused_ids:
                fired(firing, "error", PublishError("the broker refused it (nack)", [event_id]))
            else:
                fired(firing, "unroutable" if event_id in returned else "confirmed")
        if refused:
            raise PublishError(f"the broker refused {len(refused)} event(s): {refused}", refused)
        lost_delays = {firing.message.message_id for firing in firings if firing.delay} & returned
        if lost_delays:
            raise TopologyMissing(f"{len(lost_delays)} delayed event(s) found no delay queue: {sorted(lost_delays)}")
        if returned:
            logger.debug("fired %d event(s) in a batch that no service subscribes to", len(returned))

    def abandon(self) -> None:
        """The block failed: what was sent and not confirmed may or may not have reached the broker."""
        firings, self._firings = self._firings, []
        for firing in firings:
            fired(
                firing, "error", PublishError("the batch failed before its confirm came", [firing.message.message_id])
            )

    def close(self) -> None:
        self._publisher.close()


class AsyncBatch(Batch):
    """The events fired inside ``async with app.batch_async():``, their confirms awaited when the block ends."""

    async def finish_async(self) -> None:
        """:meth:`Batch.finish`, awaiting the confirms."""
        firings, self._firings = self._firings, []
        try:
            await self._publisher.wait()
        except BaseException as exc:
            _all_fired(firings, exc)
            raise
        self._settle(firings)


def _all_fired(firings: list[Firing], error: BaseException) -> None:
    for firing in firings:
        fired(firing, "error", error)


@contextmanager
def batch(context: ServiceContext, window: int = 2000) -> Iterator[Any]:
    """Fire many events fast: inside the block, firing returns the event id at once (see :class:`Batch`).

    Inside an open sink of the service (the outbox), its own batch instead.
    """
    sink = open_sink(context.name)
    if sink is not None:
        with sink.batch() as batched:
            yield batched
        return
    opened = Batch(context, context.transport.batch(window))
    try:
        with sending_to(opened):
            yield opened
        opened.finish()
    except BaseException:
        opened.abandon()
        raise
    finally:
        opened.close()


@asynccontextmanager
async def batch_async(context: ServiceContext, window: int = 2000) -> AsyncIterator[Any]:
    """:func:`batch` for coroutines: inside the block, ``fire_async`` (and a plain fire) return at once; the
    confirms are awaited when it ends, never blocking the event loop."""
    sink = open_sink(context.name)
    if sink is not None:
        with sink.batch() as batched:
            yield batched
        return
    opened = AsyncBatch(context, context.transport.batch_async(window))
    try:
        with sending_to(opened):
            yield opened
        await opened.finish_async()
    except BaseException:
        opened.abandon()
        raise
    finally:
        opened.close()
