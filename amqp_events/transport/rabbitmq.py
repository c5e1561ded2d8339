"""The transport of an app on RabbitMQ (``broker_url``): what :mod:`amqp_events.transport.base` asks of a broker."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from amqp.exceptions import NotFound
from kombu import Queue
from kombu.exceptions import OperationalError

from amqp_events.errors import PublishError, TopologyMissing
from amqp_events.topology import Binding, Topology
from amqp_events.topology.limits import Window
from amqp_events.transport import inspection, limit_settings, streams
from amqp_events.transport.base import AsyncBatchPublisher, Browsed, StreamReading
from amqp_events.transport.batches import ConfirmedBatchPublisher
from amqp_events.transport.browse import browsing
from amqp_events.transport.declare import declare_topology, rebind
from amqp_events.transport.leases import Leases
from amqp_events.transport.publisher import Connections, Publisher, publishing_user
from amqp_events.transport.retire import Retired, delete_if_idle, retire_topology
from amqp_events.wire.message import OutgoingMessage


class RabbitMQ:
    """Publishing with confirms through a connection per thread; declaring, browsing and counting through
    the app's connection pool."""

    def __init__(self, app: Connections, publish_timeout: float) -> None:
        self.app = app
        self.timeout = publish_timeout
        self.publisher = Publisher(app, publish_timeout)
        # Without heartbeats: a run longer than two would otherwise lose its lease while it runs.
        self.leases = Leases(lambda: app.connection_for_write().clone(heartbeat=0), publish_timeout)
        self.user = publishing_user(app.connection_for_write())
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
                f"firing from asyncio needs aio-pika ({exc}): pip install 'celery-amqp-events[asyncio]>=0.3'"
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
        with (
            _missing_is_topology_missing(),
            self.app.connection_for_write() as connection,
            browsing(connection, queue) as browsed,
        ):
            yield browsed

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

    def hold(self, names: Sequence[str]) -> str | None:
        return self.leases.hold(names)

    def release(self, name: str) -> None:
        self.leases.release(name)

    def admit(self, window: Window) -> bool:
        return self.leases.admit(window)

    def limit_table(self, stream: str) -> bytes | None:
        return self.leases.limit_table(stream)

    def close(self) -> None:
        self.publisher.close()
        self.leases.close()

    # -- what the operator's tools read (:mod:`amqp_events.transport.inspection`) ------------------------------

    @property
    def vhost(self) -> str:
        return str(self.app.connection_for_write().virtual_host or "/")

    def listen(
        self,
        queue: Queue,
        on_message: Callable[[Any, Mapping[str, Any]], None],
        seconds: float | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """Consume ``queue`` for ``seconds`` (or until ``stop``), each JSON message to ``on_message``."""
        inspection.listen(self.app.connection_for_write, queue, on_message, seconds, stop)

    def leases_held(self, names: Iterable[str]) -> int:
        """How many of the flow-control leases ``names`` are held now."""
        return inspection.leases_held(self.app.connection_for_write, names)

    def queue_states(self, queues: Iterable[str]) -> dict[str, tuple[int, int]]:
        """``(ready messages, consumers)`` of each of ``queues`` that exists."""
        return inspection.queue_states(self.app.connection_for_write, queues)

    def read_limit_table(self, stream: str) -> bytes | None:
        """The last table of limits set at run time in ``stream`` (``None``: none yet)."""
        with self.app.connection_for_write() as connection:
            return limit_settings.read_table(connection, stream)

    def write_limit_table(self, stream: Queue, body: bytes, content_type: str) -> None:
        """Write a table of limits as the last message of ``stream`` (declared first), with a broker confirm."""
        with self.app.connection_for_write() as connection:
            limit_settings.write_table(connection, stream, body, content_type, self.timeout)


@contextmanager
def _missing_is_topology_missing() -> Iterator[None]:
    """py-amqp's ``NotFound`` (the broker closed the channel with 404: no such queue, stream or exchange) as the
    transport's :class:`~amqp_events.errors.TopologyMissing`."""
    try:
        yield
    except NotFound as exc:
        raise TopologyMissing(str(exc)) from exc
