"""Publishing from asyncio: the same messages as :mod:`amqp_events.transport.publisher`, through aio-pika.

One connection and one channel in confirm mode per event loop, made on first use from the app's own settings
(``broker_url``, its failover hosts, TLS); nothing runs in a thread. A publish returns once the broker confirmed;
a lost connection or a refusal (nack) is tried again with a growing pause until the publish timeout, then
:class:`~amqp_events.PublishError`, as the blocking publisher does. Checked with aio-pika 9.5 and 10.2.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import weakref
from dataclasses import dataclass, field
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange
from aio_pika.exceptions import (
    AMQPConnectionError,
    ChannelClosed,
    ChannelInvalidStateError,
    ChannelNotFoundEntity,
    ChannelPreconditionFailed,
    DeliveryError,
)
from aiormq import spec
from aiormq.abc import DeliveredMessage
from kombu import Connection

from amqp_events.errors import MessageRefused, PublishError, TopologyMissing
from amqp_events.transport.publisher import (
    PERSISTENT,
    Attempts,
    Connections,
    checks_shared,
    encoded,
    exchange_to_declare,
    publishing_user,
)
from amqp_events.wire.message import OutgoingMessage

logger = logging.getLogger(__name__)

#: What a publish waits out (and then tries again): the connection or the channel lost, a refusal (nack).
_TRANSIENT = (AMQPConnectionError, ChannelInvalidStateError, ConnectionError, OSError, DeliveryError, ChannelClosed)


@dataclass
class _Link:
    """A loop's connection and channel, and the exchanges declared on that channel."""

    connection: AbstractConnection
    channel: AbstractChannel
    exchanges: dict[str, AbstractExchange] = field(default_factory=dict)


class AioPublisher:
    """Publishes :class:`OutgoingMessage` objects from coroutines: persistent, mandatory, confirmed."""

    def __init__(self, app: Connections, timeout: float) -> None:
        self.app, self.timeout = app, timeout
        self.passive = checks_shared(app)
        #: Every message's ``user_id``, which the broker verifies (:mod:`amqp_events.wire.trust`).
        self.user = publishing_user(app.connection_for_write())
        self._links: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Link] = weakref.WeakKeyDictionary()
        self._connecting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    async def publish(self, message: OutgoingMessage) -> bool:
        """Publish ``message``; ``True`` if a queue received it, ``False`` if it was unroutable."""
        attempts = Attempts(message, self.timeout, asyncio.get_running_loop().time)
        while True:
            try:
                return await self.publish_once(message, attempts.left())
            except (*_TRANSIENT, TimeoutError) as exc:
                refused = isinstance(exc, DeliveryError)
                what = "the broker refused it (nack)" if refused else f"broker unavailable ({exc!r})"
                # The next attempt opens a channel again if the broker closed this one.
                await asyncio.sleep(attempts.failed(what, exc, refused=refused))

    async def publish_once(self, message: OutgoingMessage, timeout: float) -> bool:
        """One attempt, its confirm awaited ``timeout`` seconds at most: :class:`TopologyMissing` for a missing
        exchange, :class:`MessageRefused` for a message the broker closed the channel over (larger than its
        ``max_message_size``, say)."""
        link = await self._link()  # at once when the loop has one; else connecting, within its connect timeout
        try:
            exchange = await self._exchange(link, message)
            body, properties = _message_of(message, self.user)
            # aiormq's channel under aio-pika's, as aio-pika's Exchange.publish does, without building an
            # aio_pika.Message first: its checked attributes cost as much as the publish's own framing.
            channel = await link.channel.get_underlay_channel()
            result = await channel.basic_publish(
                body, exchange=exchange.name, routing_key=message.routing_key, properties=properties,
                mandatory=True, timeout=timeout,
            )  # fmt: skip
        except ChannelNotFoundEntity as exc:
            raise TopologyMissing(str(exc)) from exc
        except ChannelPreconditionFailed as exc:
            raise MessageRefused(f"the broker closed the channel: {exc}", permanent=True) from exc
        return not isinstance(result, DeliveredMessage)  # the broker returned it: no queue took it

    async def close(self) -> None:
        """Close this loop's connection."""
        await self._forget(asyncio.get_running_loop())

    async def _link(self) -> _Link:
        loop = asyncio.get_running_loop()
        link = self._links.get(loop)
        if link is not None and not link.channel.is_closed:
            return link
        async with self._connecting.setdefault(loop, asyncio.Lock()):  # one connection for every coroutine
            link = self._links.get(loop)
            if link is None or link.channel.is_closed:
                await self._forget(loop)
                connection = await self._connect()
                channel = await connection.channel(publisher_confirms=True, on_return_raises=False)
                link = self._links[loop] = _Link(connection, channel)
        return link

    async def _connect(self) -> AbstractConnection:
        """A connection to the first of the broker's hosts (``broker_url`` may list several) that answers."""
        configured = self.app.connection_for_write()
        try:
            hosts = [Connection(url) for url in configured.alt] or [configured]
            failure: BaseException | None = None
            for host in hosts:
                try:
                    connection: AbstractConnection = await aio_pika.connect(**_parameters(host, configured.ssl))
                    return connection
                except (AMQPConnectionError, ConnectionError, OSError) as exc:
                    failure = exc
            assert failure is not None
            raise failure
        finally:
            configured.release()

    async def _exchange(self, link: _Link, message: OutgoingMessage) -> AbstractExchange:
        name = message.exchange
        exchange = link.exchanges.get(name)
        if exchange is not None:
            return exchange
        declared = exchange_to_declare(message, self.passive)
        if not name:
            exchange = link.channel.default_exchange
        elif declared is not None:
            exchange = await link.channel.declare_exchange(
                name, aio_pika.ExchangeType.TOPIC, durable=True, passive=bool(declared.passive)
            )
        else:  # declared with the topology (the delay ladder, a service's own exchanges): a 404 says it is not
            exchange = await link.channel.get_exchange(name, ensure=False)
        link.exchanges[name] = exchange
        return exchange

    async def _forget(self, loop: asyncio.AbstractEventLoop) -> None:
        link = self._links.pop(loop, None)
        if link is not None and not link.connection.is_closed:
            try:
                await link.connection.close()
            except Exception as exc:  # it is gone already: nothing to give back
                logger.debug("closing a publisher connection: %r", exc)


class AioBatchPublisher:
    """Many messages from a coroutine: each sent at once (up to ``window`` awaiting their confirms), the
    confirms awaited together by :meth:`wait`. A message the broker refused or could not take is published
    again until the publish timeout, as a single publish is; only then is it :attr:`refused`."""

    def __init__(self, publisher: AioPublisher, window: int) -> None:
        self.publisher = publisher
        self._window = asyncio.Semaphore(window)
        self._sent: list[tuple[Any, OutgoingMessage, asyncio.Task[bool]]] = []
        self.confirmed: list[Any] = []
        self.refused: list[Any] = []
        self.returned: set[str] = set()

    def publish(self, message: OutgoingMessage, key: Any = None) -> None:
        """Send ``message`` (from a coroutine on the running loop) without waiting for its confirm."""
        task = asyncio.get_running_loop().create_task(self._send(message))
        self._sent.append((message.message_id if key is None else key, message, task))

    async def _send(self, message: OutgoingMessage) -> bool:
        async with self._window:
            return await self.publisher.publish(message)

    async def wait(self) -> None:
        """Wait for the confirms of everything sent so far; a missing exchange or a message the broker will
        never take raises (what was not confirmed is then unknown)."""
        sent, self._sent = self._sent, []
        results = await asyncio.gather(*(task for _, _, task in sent), return_exceptions=True)
        for (key, message, _), result in zip(sent, results, strict=True):
            if isinstance(result, TopologyMissing | MessageRefused):
                raise result
            if isinstance(result, PublishError):
                self.refused.append(key)
            elif isinstance(result, BaseException):
                raise result
            else:
                self.confirmed.append(key)
                if not result:
                    self.returned.add(message.message_id)

    def results(self) -> tuple[list[Any], list[Any], set[str]]:
        found = (self.confirmed, self.refused, self.returned)
        self.confirmed, self.refused, self.returned = [], [], set()
        return found

    def close(self) -> None:
        for _, _, task in self._sent:
            task.cancel()
        self._sent = []


def _message_of(message: OutgoingMessage, user: str | None) -> tuple[bytes, spec.Basic.Properties]:
    """The body and properties ``message`` is published with: those the blocking publisher gives it."""
    content_type, content_encoding, body = encoded(message)
    properties = spec.Basic.Properties(
        content_type=content_type,
        content_encoding=content_encoding,
        headers=message.headers,
        delivery_mode=PERSISTENT,
        message_id=message.message_id,
        user_id=user,
    )
    return body if isinstance(body, bytes) else str(body).encode("utf-8"), properties


def _parameters(host: Connection, use_ssl: Any) -> dict[str, Any]:
    """aio-pika's connection parameters for a kombu connection's host, credentials, vhost and TLS."""
    parameters: dict[str, Any] = {
        "host": host.hostname or "localhost",
        "port": int(host.port or (5671 if use_ssl else 5672)),
        "login": host.userid or "guest",
        "password": host.password or "guest",
        "virtualhost": host.virtual_host or "/",
        "timeout": float(host.connect_timeout or 4),
    }
    if isinstance(use_ssl, ssl.SSLContext):
        parameters.update(ssl=True, ssl_context=use_ssl)
    elif use_ssl:
        context = ssl.create_default_context()
        if isinstance(use_ssl, dict):  # Celery's broker_use_ssl: ca_certs, certfile, keyfile, cert_reqs
            if use_ssl.get("ca_certs"):
                context.load_verify_locations(use_ssl["ca_certs"])
            if use_ssl.get("certfile"):
                context.load_cert_chain(use_ssl["certfile"], use_ssl.get("keyfile"))
            if use_ssl.get("cert_reqs") == ssl.CERT_NONE:
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        parameters.update(ssl=True, ssl_context=context)
    return parameters
