"""Putting messages on RabbitMQ: persistent, mandatory, confirmed, in bounded time (kombu and py-amqp).

Publisher confirms and returned messages are read from py-amqp's channel
callbacks (``basic_ack``, ``basic_nack``, ``basic_return``), checked on
py-amqp 5.4.2 with kombu 5.5.4 to 5.7.0 (tests/broker/test_batch.py, tests/broker/test_durability.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from amqp.exceptions import MessageNacked
from kombu import Connection, Exchange, Producer
from kombu.exceptions import OperationalError
from kombu.serialization import dumps

from amqp_events.errors import PublishError, PublishRefused
from amqp_events.topology.names import is_direct_exchange, is_ordered_exchange
from amqp_events.wire.message import JSON, OutgoingMessage, json_text

logger = logging.getLogger(__name__)

PERSISTENT = 2
#: Pauses between attempts to publish one message: doubling from the first to the last.
FIRST_PAUSE, MAX_PAUSE = 0.1, 1.0


def publishing_user(connection: Connection | None) -> str | None:
    """The RabbitMQ user ``connection`` logs in as, when it is known before connecting (a user and password;
    a certificate login's user is the broker's to name)."""
    if connection is None or (connection.login_method or "AMQPLAIN").upper() not in ("AMQPLAIN", "PLAIN"):
        return None
    user = connection.userid or connection.info().get("userid")  # a URL without one logs in as kombu's default
    return str(user) if user else None


def encoded(message: OutgoingMessage) -> tuple[str | None, str | None, Any]:
    """``(content_type, content_encoding, body)`` of ``message`` as published: its body JSON-encoded as kombu
    would (kombu's ``EncodeError`` for what JSON cannot carry) unless it is already bytes."""
    if message.content_type is not None:
        return message.content_type, message.content_encoding, message.body
    try:
        return JSON, "utf-8", json_text(message.body)
    except Exception:  # kombu's serializer says why, as its EncodeError
        content_type, content_encoding, body = dumps(message.body, serializer="json")
        return content_type, content_encoding, body


def send(channel: Any, message: OutgoingMessage, confirm_timeout: float | None = None) -> None:
    """Publish ``message`` on ``channel``: persistent, mandatory, its body encoded by :func:`encoded`, with the
    channel's user as its ``user_id`` (which the broker verifies: receivers learn who sent it,
    :mod:`amqp_events.wire.trust`). On a channel in confirm mode, wait up to ``confirm_timeout`` for
    the confirm.

    Straight to the channel (kombu's ``Channel.prepare_message``, py-amqp's ``basic_publish``): kombu's
    ``Producer.publish`` spends a fifth of a publish's time on options an event never has.
    """
    content_type, content_encoding, body = encoded(message)
    properties = {"delivery_mode": PERSISTENT, "message_id": message.message_id}
    user = publishing_user(getattr(channel.connection, "client", None))  # kombu's connection, set by its transport
    if user is not None:
        properties["user_id"] = user
    prepared = channel.prepare_message(body, None, content_type, content_encoding, message.headers, properties)
    channel.basic_publish(
        prepared, exchange=message.exchange, routing_key=message.routing_key, mandatory=True,
        confirm_timeout=confirm_timeout,
    )  # fmt: skip


def read_only_for_confirms(channel: Any) -> None:
    """Publish on ``channel`` without py-amqp's read of the socket before each message.

    On a connection that negotiated ``connection.blocked`` py-amqp polls the socket before every publish,
    to see a blocked notice early (a recv and two changes of the socket's timeout, a tenth of a pipelined
    publish). A publisher here reads the socket for its confirms right after, or when its window fills,
    and the notice is read there as before: only the extra poll goes.
    """
    properties = channel.connection.client_properties
    if properties.get("capabilities"):  # a copy: the app's transport options may share the one they gave
        properties["capabilities"] = {**properties["capabilities"], "connection.blocked": False}


class Attempts:
    """The attempts to publish one message within ``timeout`` seconds: after each failure, a pause that doubles
    (from :data:`FIRST_PAUSE` to :data:`MAX_PAUSE`), or :class:`PublishError` once the next would pass the deadline.
    The same for the blocking publisher and the coroutines' (each sleeps its own way)."""

    def __init__(self, message: OutgoingMessage, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.message, self.timeout, self.clock = message, timeout, clock
        self.deadline = clock() + timeout
        self.pause = FIRST_PAUSE

    def left(self) -> float:
        """Seconds left before the deadline (0.1 at least: an attempt's own waits need some)."""
        return max(0.1, self.deadline - self.clock())

    def failed(self, what: str, error: BaseException, where: str = "", refused: bool = False) -> float:
        """The attempt failed for ``what`` (``error``; ``refused``: the broker nacked it): the pause before the
        next; :class:`PublishError` when there is no time for it (:class:`PublishRefused` after a nack)."""
        message, pause = self.message, self.pause
        if self.clock() + pause >= self.deadline:
            target = message.exchange or "the default exchange"
            raise (PublishRefused if refused else PublishError)(
                f"could not publish {message.event!r} to {target!r}{where} within {self.timeout:g}s: {what}",
                [message.message_id],
            ) from error
        # Once per message at warning level; the rest of the attempts only at debug level.
        level = logging.WARNING if pause == FIRST_PAUSE else logging.DEBUG
        logger.log(level, "could not publish %s: %s; publishing again in %.1fs", message.message_id, what, pause)
        self.pause = min(pause * 2, MAX_PAUSE)
        return pause


def exchange_to_declare(message: OutgoingMessage, passive: bool = False) -> Exchange | None:
    """The events exchange ``message`` goes to, which its publisher declares (a topic exchange, as apps do).

    The default exchange always exists; the delay ladder and a service's ordered and direct exchanges are
    declared by workers with the rest of the topology.
    """
    exchange = message.exchange
    if not exchange or message.delayed or is_ordered_exchange(exchange) or is_direct_exchange(exchange):
        return None
    return Exchange(message.exchange, "topic", durable=True, auto_delete=False, passive=passive)


class Connections(Protocol):
    """Where the transport gets its kombu connections: an app (Celery's ``connection_for_write``), which reads
    ``broker_url``, its failover hosts and its transport options."""

    def connection_for_write(self, url: Any = None, **kwargs: Any) -> Connection: ...


def checks_shared(app: Any) -> bool:
    """Does ``app`` only check the shared topology (its events exchange declared passively)?"""
    settings = getattr(app, "events_settings", None)
    return bool(settings and settings.checks_shared_topology)


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

    def __init__(self, app: Connections, timeout: float) -> None:
        self.app = app
        self.timeout = timeout
        self._local = threading.local()
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._returned: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
        #: Exchanges declared so far, per channel.
        self._declared: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()

    def publish(self, message: OutgoingMessage) -> bool:
        """Publish ``message``; ``True`` if a queue received it, ``False`` if it was unroutable.

        A lost connection, or a message the broker refused (nack), is published
        again with a growing pause (a duplicate at worst), reconnecting when
        the connection is gone, until ``timeout``; then :class:`PublishError`.
        """
        producer = self._producer()
        connection = producer.connection
        attempts = Attempts(message, self.timeout)
        while True:
            try:
                if not connection.connected:
                    self._reconnect(producer, attempts.deadline)
                return self._publish_once(producer, message, attempts.deadline)
            except (
                *connection.recoverable_connection_errors,
                *connection.recoverable_channel_errors,
                OperationalError,
            ) as exc:
                refused = isinstance(exc, MessageNacked)
                what = "the broker refused it (nack)" if refused else f"broker unavailable ({exc!r})"
                time.sleep(attempts.failed(what, exc, f" on {connection.as_uri()}", refused))
                if refused:  # see ConfirmedBatchPublisher._reopen_channel: a fresh channel, on the same connection
                    stale = producer.channel
                    producer.revive(connection.channel())
                    if stale is not connection.default_channel:
                        with contextlib.suppress(Exception):
                            stale.close()
                else:  # the connection is gone
                    connection.collect()

    def _reconnect(self, producer: Producer, deadline: float) -> None:
        """Connect once to each of the broker's hosts in turn (``broker_url`` may list several) until one answers."""
        connection = producer.connection
        connection.ensure_connection(
            max_retries=max(1, len(connection.alt)) - 1,
            interval_start=0,  # the pause between rounds is publish()'s
            timeout=max(0.1, deadline - time.monotonic()),
        )
        producer.revive(connection.default_channel)

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
        declared = self._declared.setdefault(channel, set())
        exchange = exchange_to_declare(message, checks_shared(self.app)) if message.exchange not in declared else None
        if exchange is not None:
            exchange.declare(channel=channel)
            declared.add(exchange.name)
        send(channel, message, confirm_timeout=max(0.1, deadline - time.monotonic()))
        if message.message_id in returned:
            returned.discard(message.message_id)
            return False
        return True

    def _returns_on(self, channel: Any) -> set[str]:
        """Ids of messages the broker returned as unroutable on ``channel`` (set up, with
        :func:`read_only_for_confirms`, when the channel is first used).

        RabbitMQ sends ``basic.return`` before the confirm, so by the time a
        confirmed publish comes back the set already holds its id.
        """
        returned = self._returned.get(channel)
        if returned is None:  # a channel used for the first time
            returned = self._returned[channel] = set()
            read_only_for_confirms(channel)

            def on_return(exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
                returned.add(message.properties.get("message_id"))

            channel.events["basic_return"].add(on_return)
        return returned
