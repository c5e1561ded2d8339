"""Putting messages on the broker: persistent, mandatory, confirmed, in bounded time."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Any

from celery import Celery
from kombu import Connection, Exchange, Producer

from amqp_events.message import OutgoingMessage

logger = logging.getLogger(__name__)

PERSISTENT = 2


class PublishError(RuntimeError):
    """The broker could not be reached, or did not confirm a message, in time."""


def send(producer: Producer, message: OutgoingMessage, **options: Any) -> None:
    """Publish ``message``: persistent, mandatory, its body JSON-encoded unless it is already bytes."""
    producer.publish(
        message.body,
        exchange=message.exchange,
        routing_key=message.routing_key,
        headers=message.headers,
        serializer=None if message.content_type else "json",
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        delivery_mode=PERSISTENT,
        mandatory=True,
        message_id=message.message_id,
        **options,
    )


class Publisher:
    """Publishes :class:`OutgoingMessage` objects with a broker confirm each.

    Every message is persistent and published with the ``mandatory`` flag on
    a channel in confirm mode, so :meth:`publish` returns only once the
    broker has taken responsibility for it, and knows whether any queue got
    it. A broker that is down or does not confirm makes it raise
    :class:`PublishError` after ``timeout`` seconds.

    Each thread of each process publishes through a producer of its own on a
    connection of its own, made from the app's settings: nothing is taken
    from a pool or revived per message, and a forked child never shares its
    parent's socket.
    """

    def __init__(self, app: Celery, timeout: float, declare: tuple[Exchange, ...] = ()) -> None:
        self.app = app
        self.timeout = timeout
        #: Exchanges a publisher may need before any worker declared them (declared once per channel).
        self.declare = list(declare)
        self._local = threading.local()
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._returned: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
        self._declared_on: weakref.WeakSet[Any] = weakref.WeakSet()

    def publish(self, message: OutgoingMessage) -> bool:
        """Publish ``message``; ``True`` if a queue received it, ``False`` if it was unroutable."""
        producer = self._producer()
        connection = producer.connection
        deadline = time.monotonic() + self.timeout
        if connection.connected:  # the usual case, without building kombu's retry wrapper each time
            try:
                return self._publish_once(producer, message, deadline)
            except connection.recoverable_connection_errors + connection.recoverable_channel_errors:
                pass  # publish again below, reconnecting, until the deadline (a duplicate at worst)

        def give_up_after_deadline(exc: BaseException, interval: float) -> None:
            if time.monotonic() + interval >= deadline:
                raise PublishError(
                    f"could not publish {message.headers.get('task')!r} to "
                    f"{message.exchange or 'the default exchange'!r} on {connection.as_uri()} "
                    f"within {self.timeout:g}s: {exc}"
                ) from exc
            logger.warning("broker unavailable (%s), publishing again in %.1fs", exc, interval)

        ensured_publish = connection.ensure(
            producer,
            self._publish_once,
            errback=give_up_after_deadline,
            interval_start=0,
            interval_step=1,
            interval_max=1,
        )
        return bool(ensured_publish(producer, message, deadline))

    def close(self) -> None:
        """Close every connection this publisher opened (in this process)."""
        for connection in list(self._connections):
            connection.release()
        self._local = threading.local()

    def _producer(self) -> Producer:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():  # first use in this thread, or a forked child
            connection = self.app.connection_for_write()
            self._connections.add(connection)
            local.producer = Producer(connection)
            local.pid = os.getpid()
        producer: Producer = local.producer
        return producer

    def _publish_once(self, producer: Producer, message: OutgoingMessage, deadline: float) -> bool:
        channel = producer.channel
        returned = self._returns_on(channel)
        if channel not in self._declared_on:
            for exchange in self.declare:
                exchange.declare(channel=channel)
            self._declared_on.add(channel)
        send(producer, message, confirm_timeout=max(0.1, deadline - time.monotonic()))
        if message.message_id in returned:
            returned.discard(message.message_id)
            return False
        return True

    def _returns_on(self, channel: Any) -> set[str]:
        """Ids of messages the broker returned as unroutable on ``channel``.

        RabbitMQ sends ``basic.return`` before the confirm, so by the time a
        confirmed publish comes back the set already holds its id.
        """
        returned = self._returned.get(channel)
        if returned is None:
            returned = self._returned[channel] = set()

            def on_return(exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
                returned.add(message.properties.get("message_id"))

            channel.events["basic_return"].add(on_return)
        return returned


class ConfirmedBatch:
    """Publishes many messages and awaits their broker confirms together (pipelined).

    One confirm per message costs a network round trip each; keeping up to
    ``window`` messages in flight and collecting their confirms as they come
    removes that wait. Uses a connection of its own, closed by :meth:`close`.
    """

    def __init__(self, app: Celery, timeout: float, declare: tuple[Exchange, ...] = (), window: int = 2000) -> None:
        self.timeout, self.window = timeout, window
        self.connection = app.connection_for_write(transport_options={"confirm_publish": False})
        self.channel: Any = self.connection.channel()
        self.channel.confirm_select()
        for exchange in declare:
            exchange.declare(channel=self.channel)
        self.producer = Producer(self.channel)
        self._next_tag = 1
        self._unconfirmed: dict[int, str] = {}  # delivery tag -> message id, oldest first
        #: Ids the broker refused (nack).
        self.refused: list[str] = []
        #: Ids no queue received (returned as unroutable).
        self.returned: set[str] = set()
        self.channel.events["basic_ack"].add(self._on_ack)
        self.channel.events["basic_nack"].add(self._on_nack)
        self.channel.events["basic_return"].add(self._on_return)

    def publish(self, message: OutgoingMessage) -> None:
        """Send ``message`` without waiting for its confirm (at most ``window`` are in flight)."""
        try:
            send(self.producer, message)
        except self.connection.connection_errors as exc:
            raise self._interrupted(exc) from exc
        self._unconfirmed[self._next_tag] = message.message_id
        self._next_tag += 1
        if len(self._unconfirmed) >= self.window:
            self._drain(until=self.window // 2)

    def wait(self) -> None:
        """Wait until the broker confirmed (or refused) everything sent so far."""
        self._drain(until=0)

    def close(self) -> None:
        self.connection.release()

    def _drain(self, until: int) -> None:
        deadline = time.monotonic() + self.timeout
        while len(self._unconfirmed) > until:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishError(
                    f"the broker did not confirm {len(self._unconfirmed)} event(s) within {self.timeout:g}s: "
                    + ", ".join(self._unconfirmed.values())
                )
            try:
                self.connection.drain_events(timeout=remaining)
            except TimeoutError:
                continue
            except self.connection.connection_errors as exc:
                raise self._interrupted(exc) from exc

    def _interrupted(self, exc: BaseException) -> PublishError:
        return PublishError(
            f"the connection failed during a batch ({exc}); these event(s) may not have been delivered: "
            + ", ".join(self._unconfirmed.values())
        )

    def _settle(self, tag: int, multiple: bool) -> list[str]:
        settled = []
        for pending in list(self._unconfirmed) if multiple else [tag]:
            if pending > tag:
                break
            message_id = self._unconfirmed.pop(pending, None)
            if message_id is not None:
                settled.append(message_id)
        return settled

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self.refused.extend(self._settle(tag, multiple))

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        self.returned.add(message.properties.get("message_id"))
