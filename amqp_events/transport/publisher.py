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
from collections.abc import Iterator
from typing import Any, Protocol

from amqp.exceptions import ChannelError, MessageNacked, PreconditionFailed
from kombu import Connection, Exchange, Producer
from kombu.exceptions import OperationalError
from kombu.serialization import dumps

from amqp_events.errors import MessageRefused, PublishError
from amqp_events.topology.names import is_direct_exchange, is_ordered_exchange
from amqp_events.wire.message import OutgoingMessage

logger = logging.getLogger(__name__)

PERSISTENT = 2
#: Pauses between attempts to publish one message: doubling from the first to the last.
FIRST_PAUSE, MAX_PAUSE = 0.1, 1.0


def send(channel: Any, message: OutgoingMessage, confirm_timeout: float | None = None) -> None:
    """Publish ``message`` on ``channel``: persistent, mandatory, its body JSON-encoded by kombu unless it is
    already bytes. On a channel in confirm mode, wait up to ``confirm_timeout`` for the confirm.

    Straight to the channel (kombu's ``Channel.prepare_message``, py-amqp's ``basic_publish``): kombu's
    ``Producer.publish`` spends a fifth of a publish's time on options an event never has.
    """
    content_type, content_encoding, body = message.content_type, message.content_encoding, message.body
    if content_type is None:  # kombu's JSON serializer (EncodeError for what JSON cannot carry)
        content_type, content_encoding, body = dumps(body, serializer="json")
    properties = {"delivery_mode": PERSISTENT, "message_id": message.message_id}
    prepared = channel.prepare_message(body, None, content_type, content_encoding, message.headers, properties)
    channel.basic_publish(
        prepared, exchange=message.exchange, routing_key=message.routing_key, mandatory=True,
        confirm_timeout=confirm_timeout,
    )  # fmt: skip


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
        deadline = time.monotonic() + self.timeout
        pause = FIRST_PAUSE
        while True:
            try:
                if not connection.connected:
                    self._reconnect(producer, deadline)
                return self._publish_once(producer, message, deadline)
            except (
                *connection.recoverable_connection_errors,
                *connection.recoverable_channel_errors,
                OperationalError,
            ) as exc:
                refused = isinstance(exc, MessageNacked)
                what = "the broker refused it (nack)" if refused else f"broker unavailable ({exc!r})"
                if time.monotonic() + pause >= deadline:
                    raise PublishError(
                        f"could not publish {message.event!r} to "
                        f"{message.exchange or 'the default exchange'!r} on {connection.as_uri()} "
                        f"within {self.timeout:g}s: {what}",
                        [message.message_id],
                    ) from exc
                # Once per message at warning level; the rest of the attempts only at debug level.
                level = logging.WARNING if pause == FIRST_PAUSE else logging.DEBUG
                logger.log(
                    level, "could not publish %s: %s; publishing again in %.1fs", message.message_id, what, pause
                )
                time.sleep(pause)
                pause = min(pause * 2, MAX_PAUSE)
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


class ConfirmedBatchPublisher:
    """Publishes many messages and awaits their broker confirms together (pipelined).

    One confirm per message costs a network round trip each; keeping up to
    ``window`` messages in flight and collecting their confirms as they come
    removes that wait. Uses a connection of its own, closed by :meth:`close`.

    When the connection fails (its node died), the batch goes on over a new
    connection to the next of the broker's hosts and publishes again every
    message not yet confirmed: a duplicate at worst, never a loss. Messages
    the broker refused (a quorum queue electing a new leader nacks them) are
    published again too, with a growing pause, until ``timeout``; only then
    are they :attr:`refused`. If no host answers within ``timeout``,
    :class:`PublishError` lists what may be missing.
    """

    def __init__(self, app: Connections, timeout: float, window: int = 2000) -> None:
        self.timeout, self.window = timeout, window
        self.passive = checks_shared(app)
        self.connection = app.connection_for_write(transport_options={"confirm_publish": False})
        self._errors = (*self.connection.connection_errors, OperationalError)
        #: Delivery tag -> (key, message) of what the broker has not confirmed yet, oldest first.
        self._pending: dict[int, tuple[Any, OutgoingMessage]] = {}
        #: What the broker refused so far, to be published again.
        self._nacked: list[tuple[Any, OutgoingMessage]] = []
        #: Keys of the messages the broker confirmed, in order (a key is the message id unless given).
        self.confirmed: list[Any] = []
        #: Keys of the messages the broker refused (nack).
        self.refused: list[Any] = []
        #: Ids no queue received (returned as unroutable).
        self.returned: set[str] = set()
        #: How many times the connection failed and the batch went on over another one.
        self.failovers = 0
        self._open(time.monotonic() + timeout)

    def publish(self, message: OutgoingMessage, key: Any = None) -> None:
        """Send ``message`` without waiting for its confirm (at most ``window`` are in flight);
        :class:`~amqp_events.errors.MessageRefused` when the broker closed the channel over one."""
        with _closed_channel_is_refused():
            self._publish(message, key)

    def _publish(self, message: OutgoingMessage, key: Any) -> None:
        entry = (message.message_id if key is None else key, message)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self._declare_exchange_of(message)
                send(self.channel, message)
                break
            except self._errors as exc:
                self._fail_over(exc, deadline)
        self._pending[self._next_tag] = entry
        self._next_tag += 1
        if len(self._pending) >= self.window:
            self._drain(until=self.window // 2)

    def wait(self) -> None:
        """Wait until the broker confirmed everything sent so far (or refused it until ``timeout``)."""
        with _closed_channel_is_refused():
            self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + self.timeout
        pause = FIRST_PAUSE
        self._drain(until=0)
        while self._nacked and time.monotonic() + pause < deadline:
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE)
            self._reopen_channel(deadline)
            again, self._nacked = self._nacked, []
            for key, message in again:
                self._publish(message, key)
            self._drain(until=0)
        self.refused.extend(key for key, _ in self._nacked)
        self._nacked = []

    def results(self) -> tuple[list[Any], list[Any], set[str]]:
        """``(confirmed, refused, returned)`` since the last call, and forget them (to publish the next batch)."""
        results = (self.confirmed, self.refused, self.returned)
        self.confirmed, self.refused, self.returned = [], [], set()
        return results

    def close(self) -> None:
        self.connection.release()

    def _open(self, deadline: float) -> None:
        """Connect to the first of the broker's hosts that answers, then open a channel in confirm mode."""
        self.connection.ensure_connection(
            max_retries=max(1, len(self.connection.alt)) - 1,
            interval_start=0,
            timeout=max(0.1, deadline - time.monotonic()),
        )
        self.channel: Any = self.connection.channel()
        self.channel.confirm_select()
        self._declared: set[str] = set()
        self._next_tag = 1  # delivery tags count per channel
        self.channel.events["basic_ack"].add(self._on_ack)
        self.channel.events["basic_nack"].add(self._on_nack)
        self.channel.events["basic_return"].add(self._on_return)

    def _reopen_channel(self, deadline: float) -> None:
        """A fresh channel: RabbitMQ 3.10 keeps nacking, for good, what a channel opened while a quorum
        queue had no leader publishes to that queue; a channel opened afterwards is fine."""
        with contextlib.suppress(*self._errors):
            self.channel.close()
        self._open(deadline)

    def _drain(self, until: int) -> None:
        deadline = time.monotonic() + self.timeout
        while len(self._pending) > until:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                ids = [str(key) for key, _ in self._pending.values()]
                raise PublishError(
                    f"the broker did not confirm {len(ids)} event(s) within {self.timeout:g}s: " + ", ".join(ids), ids
                )
            try:
                self.connection.drain_events(timeout=remaining)
            except TimeoutError:
                continue
            except self._errors as exc:
                self._fail_over(exc, deadline)

    def _fail_over(self, error: BaseException, deadline: float) -> None:
        """Open a connection to the next host that answers and publish again what is not confirmed."""
        unconfirmed = list(self._pending.values())
        pause = FIRST_PAUSE
        while time.monotonic() + pause < deadline:
            logger.warning(
                "a batch lost its connection (%s); resending %d unconfirmed event(s)", error, len(unconfirmed)
            )
            self.connection.collect()
            try:
                self._open(deadline)
                self._pending = {}
                for key, message in unconfirmed:
                    self._declare_exchange_of(message)
                    send(self.channel, message)
                    self._pending[self._next_tag] = (key, message)
                    self._next_tag += 1
            except self._errors as exc:
                error = exc
                time.sleep(pause)
                pause = min(pause * 2, MAX_PAUSE)
                continue
            self.failovers += 1
            return
        ids = [str(key) for key, _ in unconfirmed]
        raise PublishError(
            f"the connection failed during a batch ({error}) and no host answered within {self.timeout:g}s; "
            "these event(s) may not have been delivered: " + ", ".join(ids),
            ids,
        ) from error

    def _declare_exchange_of(self, message: OutgoingMessage) -> None:
        exchange = exchange_to_declare(message, self.passive) if message.exchange not in self._declared else None
        if exchange is not None:
            exchange.declare(channel=self.channel)
            self._declared.add(exchange.name)

    def _settle(self, tag: int, multiple: bool) -> list[tuple[Any, OutgoingMessage]]:
        settled = []
        for pending in list(self._pending) if multiple else [tag]:
            if pending > tag:
                break
            entry = self._pending.pop(pending, None)
            if entry is not None:
                settled.append(entry)
        return settled

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self.confirmed.extend(key for key, _ in self._settle(tag, multiple))

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._nacked.extend(self._settle(tag, multiple))

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        self.returned.add(message.properties.get("message_id"))


@contextlib.contextmanager
def _closed_channel_is_refused() -> Iterator[None]:
    try:
        yield
    except ChannelError as exc:  # the channel is gone with it: the caller starts another batch
        raise MessageRefused(f"the broker closed the channel: {exc}", isinstance(exc, PreconditionFailed)) from exc
