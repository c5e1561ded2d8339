"""Where a service's messages go: what the core asks of a broker.

Everything a service sends or reads outside a worker's consumer goes through
its transport (:attr:`~amqp_events.core.context.ServiceContext.transport`):
fired events, batches and outbox rows, the copies a handler's outcome sends
(retries, archived messages), and browsing the archive. On RabbitMQ it is
:class:`amqp_events.transport.rabbitmq.RabbitMQ`; the in-process mode of
:mod:`amqp_events.testing` gives an app a broker in memory instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from kombu import Queue

from amqp_events.topology import Topology
from amqp_events.topology.limits import Window
from amqp_events.wire.message import OutgoingMessage, StoredMessage

#: Browsing a queue yields each message with a function that removes it for good.
Browsed = Iterator[tuple[StoredMessage, Callable[[], None]]]


@dataclass
class StreamReading:
    """Reading a stream: its messages from where the reading started up to ``end``, each with its offset."""

    #: The offset of the stream's last message when the reading began (-1: the stream was empty).
    end: int
    messages: Iterator[tuple[int, StoredMessage]]


class BatchPublisher(Protocol):
    """Publishes many messages, collecting their confirms together."""

    def publish(self, message: OutgoingMessage, key: Any = None) -> None:
        """Send ``message`` (identified by ``key``, default its id) without waiting for its confirm."""

    def wait(self) -> None:
        """Wait for the confirms of everything sent so far."""

    def results(self) -> tuple[list[Any], list[Any], set[str]]:
        """``(confirmed keys, refused keys, returned ids)`` since the last call, then forget them."""

    def close(self) -> None: ...


class AsyncBatchPublisher(Protocol):
    """A batch publisher for coroutines: :meth:`publish` sends on the running loop, :meth:`wait` is awaited."""

    def publish(self, message: OutgoingMessage, key: Any = None) -> None: ...

    async def wait(self) -> None: ...

    def results(self) -> tuple[list[Any], list[Any], set[str]]: ...

    def close(self) -> None: ...


class AwaitedBatch:
    """A batch publisher that never blocks (a broker in memory) as an :class:`AsyncBatchPublisher`."""

    def __init__(self, batch: BatchPublisher) -> None:
        self.batch = batch
        self.publish, self.results, self.close = batch.publish, batch.results, batch.close

    async def wait(self) -> None:
        self.batch.wait()


class Transport(Protocol):
    #: Exceptions that mean the broker cannot be reached now (what an outbox relay waits out).
    errors: tuple[type[BaseException], ...]
    #: The RabbitMQ user its messages go out as: their ``user_id``, which the broker verifies (``None``: not known).
    user: str | None

    def publish(self, message: OutgoingMessage) -> bool:
        """Publish ``message`` with a confirm; ``False`` if no queue received it; :class:`TopologyMissing` if its
        exchange is not on the broker."""

    def batch(self, window: int) -> BatchPublisher:
        """A batch publisher with up to ``window`` confirms outstanding."""

    async def publish_async(self, message: OutgoingMessage) -> bool:
        """:meth:`publish` from a coroutine, never blocking its event loop."""

    def batch_async(self, window: int) -> AsyncBatchPublisher:
        """:meth:`batch` for coroutines."""

    def declare(self, topology: Topology) -> None:
        """Declare a service's topology."""

    def browse(self, queue: str) -> AbstractContextManager[Browsed]:
        """Every message of ``queue``, in order; those not removed stay, in their order."""

    def count(self, queue: str) -> int:
        """Messages in ``queue`` right now."""

    def read_stream(self, stream: str, start: int | datetime) -> AbstractContextManager[StreamReading]:
        """The messages of ``stream`` from offset ``start`` (or from the time ``start``, give or take a few
        earlier ones) up to its last one now; a stream does not lose what is read."""

    def hold(self, names: Sequence[str]) -> str | None:
        """Take the first of the leases ``names`` nobody holds, until :meth:`release` or this process ends
        (flow control: :mod:`amqp_events.transport.leases`); ``None`` when each is held."""

    def release(self, name: str) -> None:
        """Give back the lease ``name``."""

    def admit(self, window: Window) -> bool:
        """Count a start in ``window``'s bounded queue (:mod:`amqp_events.topology.limits`); ``False`` when it
        is full; :class:`~amqp_events.errors.LimitUnavailable` when it cannot be reached (nor can :meth:`hold`)."""

    def limit_table(self, stream: str) -> bytes | None:
        """The last table of limits set at run time in ``stream`` as this process follows it (``None``: none was):
        what a worker applies."""

    def read_limit_table(self, stream: str) -> bytes | None:
        """The last table of limits set at run time in ``stream``, read now (``None``: none was)."""

    def write_limit_table(self, stream: Queue, body: bytes, content_type: str) -> None:
        """Write a table of limits as the last message of ``stream`` (declared first), with a broker confirm."""

    def close(self) -> None: ...
