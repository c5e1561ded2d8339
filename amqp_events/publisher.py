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
            confirm_timeout=max(0.1, deadline - time.monotonic()),
        )
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
