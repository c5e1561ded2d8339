"""What an app fires with: ``@app.event``, ``app.fire`` and ``app.batch``, and their coroutine twins
``app.fire_async`` and ``app.batch_async`` (the ``[asyncio]`` extra on RabbitMQ), each a thin layer over
:mod:`amqp_events.core.firing`."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from amqp_events.core import firing
from amqp_events.wire import cloud_events
from amqp_events.wire.message import OutgoingMessage

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from amqp_events.core.context import ServiceContext
    from amqp_events.core.events import FireOptions
    from amqp_events.settings import Settings
    from amqp_events.transport.rabbitmq import RabbitMQ


class Producing:
    """The producing side of :class:`~amqp_events.celery.EventsApp`."""

    if TYPE_CHECKING:  # the app's

        @property
        def context(self) -> ServiceContext: ...

        @property
        def events_settings(self) -> Settings: ...

        @property
        def rabbitmq(self) -> RabbitMQ: ...

    def wire_format(self, given: str | None = None) -> str:
        """The wire format an event fires in: ``given``, else the app's ``amqp_events_wire_format``."""
        return cloud_events.check_wire_format(given) if given else self.events_settings.wire_format

    def fire(
        self,
        event: str,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Unpack[FireOptions],
    ) -> str:
        """Publish ``event`` (no validation) and return its id once the broker confirmed it.

        With ``countdown`` seconds or an ``eta`` the event first waits on the
        broker's delay ladder, then reaches every subscribed service.
        ``event_id`` fires it under a given id instead of a new one: to fire
        again an event whose firing raised :class:`~amqp_events.PublishError`
        (its ``event_ids``), so that a copy that did reach the broker is the
        same event to every inbox. ``wire_format`` overrides the app's
        ``amqp_events_wire_format`` ("cloudevents" takes keyword arguments only).
        ``key`` names the aggregate the event belongs to (the ``event_key``
        header; see :meth:`event`).
        Inside ``with app.batch():`` it returns at once; inside ``with
        app.outbox(...):`` it writes a row.
        """
        return firing.fire(self.context, event, args, kwargs, **self._checked(options))

    def batch(self, window: int = 2000) -> Any:
        """Fire many events fast: inside the block, firing returns the event id at once.

        The broker's confirms are collected together (up to ``window``
        messages in flight) and awaited when the block ends; then
        :class:`~amqp_events.PublishError` names any event the broker refused
        or did not confirm in time. Validation still runs at each call::

            with app.batch():
                for invoice in invoices:
                    invoice_paid(invoice.id, invoice.amount)
        """
        return firing.batch(self.context, window)

    def event_message(
        self,
        event: str,
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
        countdown: float | None = None,
        eta: datetime | None = None,
        wire_format: str | None = None,
        key: str | int | None = None,
    ) -> OutgoingMessage:
        """The message that fires ``event``, ready to publish (no validation, nothing sent)."""
        context = self.context
        message, delay = firing.fired_message(context, event, args, kwargs, countdown, eta, None, wire_format, key)
        return firing.delayed(context, message, delay)

    async def fire_async(
        self,
        event: str,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Unpack[FireOptions],
    ) -> str:
        """:meth:`fire` from a coroutine, with the same options: returns the event's id once the broker confirmed
        it, awaiting the confirm on the running event loop (one connection per loop, through aio-pika), and
        raises :class:`~amqp_events.PublishError` where :meth:`fire` does. Inside ``async with
        app.batch_async():`` it returns at once."""
        return await firing.fire_async(self.context, event, args, kwargs, **self._checked(options))

    def _checked(self, options: FireOptions) -> FireOptions:
        """``options`` with its wire format checked (the app's when none is given)."""
        if options.get("wire_format"):
            options["wire_format"] = self.wire_format(options["wire_format"])
        return options

    def batch_async(self, window: int = 2000) -> Any:
        """:meth:`batch` for coroutines: ``async with app.batch_async():`` collects the confirms of the events
        fired inside (with ``await ... fire_async()`` or a plain call) and awaits them when the block ends."""
        return firing.batch_async(self.context, window)

    async def close_async(self) -> None:
        """Close the connection the running event loop fires through (at the end of an asyncio app)."""
        if "rabbitmq" in self.__dict__:
            await self.rabbitmq.close_async()
