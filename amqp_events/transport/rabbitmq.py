"""The transport of an app on RabbitMQ (``broker_url``): what :mod:`amqp_events.transport.base` asks of a broker."""

from __future__ import annotations

import functools
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from amqp.exceptions import AccessRefused, NotFound
from kombu.exceptions import OperationalError

from amqp_events.errors import PermissionRefused, PublishError, TopologyMissing
from amqp_events.topology import Binding, Topology
from amqp_events.transport import streams
from amqp_events.transport.base import AsyncBatchPublisher, Browsed, StreamReading
from amqp_events.transport.declare import declare_topology, rebind
from amqp_events.transport.publisher import ConfirmedBatchPublisher, Connections, Publisher
from amqp_events.transport.retire import Retired, delete_if_idle, retire_topology
from amqp_events.wire.message import OutgoingMessage, StoredMessage


class RabbitMQ:
    """Publishing with confirms through a connection per thread; declaring, browsing and counting through
    the app's connection pool."""

    def __init__(self, app: Connections, publish_timeout: float) -> None:
        self.app = app
        self.timeout = publish_timeout
        self.publisher = Publisher(app, publish_timeout)
        self.errors: tuple[type[BaseException], ...] = (
            PublishError,
            OperationalError,
            *app.connection_for_write().connection_errors,
        )

    def publish(self, message: OutgoingMessage) -> bool:
        with _missing_is_topology_missing():
            return self.publisher.publish(message)

    def batch(self, window: int) -> ConfirmedBatchPublisher:
        return ConfirmedBatchPublisher(self.app, self.timeout, window)

    @functools.cached_property
    def aio(self) -> Any:
        """The publisher of coroutines (:mod:`amqp_events.transport.aio`): the ``[asyncio]`` extra, aio-pika."""
        try:
            from amqp_events.transport.aio import AioPublisher
        except ImportError as exc:
            raise ImportError(
                f"firing from asyncio needs aio-pika ({exc}): pip install 'celery-amqp-events[asyncio]'"
            ) from exc
        return AioPublisher(self.app, self.timeout)

    async def publish_async(self, message: OutgoingMessage) -> bool:
        return bool(await self.aio.publish(message))

    def batch_async(self, window: int) -> AsyncBatchPublisher:
        from amqp_events.transport.aio import AioBatchPublisher

        return AioBatchPublisher(self.aio, window)

    async def close_async(self) -> None:
        """Close the connection of the running event loop's publisher."""
        if "aio" in self.__dict__:
            await self.aio.close()

    def declare(self, topology: Topology) -> None:
        with self.app.connection_for_write() as connection:
            declare_topology(connection, topology)

    def retire(self, topology: Topology, discard: bool = False) -> Retired:
        """Delete the service's own queues and exchanges (:mod:`amqp_events.transport.retire`)."""
        with self.app.connection_for_write() as connection:
            return retire_topology(connection, topology, discard)

    def rebind(self, bind: Iterable[Binding], unbind: Iterable[Binding]) -> None:
        """Add bindings, then remove others (:func:`amqp_events.transport.declare.rebind`)."""
        with self.app.connection_for_write() as connection:
            rebind(connection, bind, unbind)

    def delete_if_idle(self, queue: str) -> str | None:
        """Delete ``queue`` if unread and empty; otherwise say why not."""
        with self.app.connection_for_write() as connection:
            return delete_if_idle(connection, queue)

    @contextmanager
    def browse(self, queue: str) -> Iterator[Browsed]:
        with _missing_is_topology_missing(), self._browsing(queue) as browsed:
            yield browsed

    @contextmanager
    def _browsing(self, queue: str) -> Iterator[Browsed]:
        """Take every message unacked; whatever is not acked goes back when the channel closes, and the browse
        ends once the broker counts it back in the queue (a quorum queue takes a moment), so that the next
        reading finds it."""
        with self.app.connection_for_write() as connection:
            first: Any = connection.channel()
            waiting = _after_other_browses(first, queue)
            # One consumer takes at most PREFETCH_MAX unacked: as many consumers as it takes, each on its channel.
            channels = [first, *(connection.channel() for _ in range(1, math.ceil(waiting / PREFETCH_MAX)))]
            removed: list[int] = []
            try:
                yield _take_all(connection, channels, queue, waiting, removed)
            except AccessRefused as refused:  # reading it needs the read grant, counting it does not
                raise PermissionRefused(f"{refused.reply_text}: this user may not read {queue!r}") from None
            finally:
                for channel in channels:
                    channel.close()
            _wait_until_back(connection, queue, waiting - len(removed))

    def count(self, queue: str) -> int:
        with _missing_is_topology_missing(), self.app.connection_for_write() as connection:
            channel: Any = connection.default_channel
            return int(channel.queue_declare(queue, passive=True).message_count)

    @contextmanager
    def read_stream(self, stream: str, start: int | datetime) -> Iterator[StreamReading]:
        with (
            _missing_is_topology_missing(),
            self.app.connection_for_write() as connection,
            streams.read_stream(connection, stream, start) as reading,
        ):
            yield reading

    def close(self) -> None:
        self.publisher.close()


@contextmanager
def _missing_is_topology_missing() -> Iterator[None]:
    """py-amqp's ``NotFound`` (the broker closed the channel with 404: no such queue, stream or exchange) as the
    transport's :class:`~amqp_events.errors.TopologyMissing`."""
    try:
        yield
    except NotFound as exc:
        raise TopologyMissing(str(exc)) from exc


#: Seconds without a delivery after which a browse ends with fewer messages than the queue counted (some expired).
BROWSE_IDLE = 2.0
#: Seconds a browse waits for another one of the same queue to end (a console reading an archive of 10,000
#: messages holds it about a second).
BROWSE_TURN = 10.0
#: The most unacked messages one consumer of a browse takes: AMQP's prefetch count is 16 bits (and a quorum queue
#: gives a consumer without a limit 2,000 at most, not every message: a browse of 10,000 saw 2,000).
PREFETCH_MAX = 65_535


def _after_other_browses(channel: Any, queue: str) -> int:
    """The messages of ``queue`` once no one else browses it (a queue that is only browsed has no consumer but a
    browse: while one holds its messages, another would see it empty), waiting :data:`BROWSE_TURN` at most; a
    clear 404 when it is missing."""
    deadline = time.monotonic() + BROWSE_TURN
    declared = channel.queue_declare(queue, passive=True)
    while declared.consumer_count and time.monotonic() < deadline:
        time.sleep(0.02)
        declared = channel.queue_declare(queue, passive=True)
    return int(declared.message_count)


def _take_all(connection: Any, channels: list[Any], queue: str, waiting: int, removed: list[int]) -> Browsed:
    """The ``waiting`` messages of ``queue``, delivered to consumers whose prefetch together covers them (a fetch
    per message would cost a round trip each: 10,000 archived messages took 10 s), none acked unless removed
    (each removal's tag is noted in ``removed``)."""
    if not waiting:
        return
    taken: deque[Any] = deque()
    consumers = []
    for channel in channels:
        channel.basic_qos(0, min(waiting, PREFETCH_MAX), False)
        consumers.append((channel, channel.basic_consume(queue, no_ack=False, callback=taken.append)))
    given = 0
    while given < waiting:
        if not taken:
            try:
                connection.drain_events(timeout=BROWSE_IDLE)
            except TimeoutError:
                break
            continue
        fetched = taken.popleft()
        given += 1
        body = fetched.body if isinstance(fetched.body, bytes) else str(fetched.body).encode("utf-8")
        properties = fetched.properties  # py-amqp has no attribute for a property a message lacks
        headers = properties.get("application_headers")
        stored = StoredMessage(
            dict(headers) if isinstance(headers, dict) else {},
            body,
            properties.get("content_type"),
            properties.get("content_encoding"),
        )
        yield stored, functools.partial(_remove, fetched.channel, fetched.delivery_tag, removed)
    for channel, tag in consumers:
        channel.basic_cancel(tag)


def _remove(channel: Any, delivery_tag: int, removed: list[int]) -> None:
    channel.basic_ack(delivery_tag)
    removed.append(delivery_tag)


def _wait_until_back(connection: Any, queue: str, expected: int) -> None:
    """Wait (a few seconds at most) until ``queue`` counts ``expected`` messages or more."""
    deadline = time.monotonic() + BROWSE_IDLE
    channel = connection.default_channel
    while channel.queue_declare(queue, passive=True).message_count < expected and time.monotonic() < deadline:
        time.sleep(0.02)
