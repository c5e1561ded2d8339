"""Where an app's messages go: a RabbitMQ broker, or the in-process mode of :mod:`amqp_events.testing`.

Everything an app sends or reads outside a worker's consumer goes through its
transport (``app.transport``): fired events, batches and outbox rows, the
copies a handler's outcome sends (retries, archived messages), and the
archive's browsing. :class:`RabbitMQ` is the transport of every app unless
the in-process mode is on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from amqp_events.declare import declare_topology
from amqp_events.message import OutgoingMessage
from amqp_events.publisher import ConfirmedBatch, Publisher
from amqp_events.topology import Topology

if TYPE_CHECKING:
    from amqp_events.app import EventsApp


@dataclass(frozen=True)
class StoredMessage:
    """A message as it sits in a queue: what browsing a queue returns."""

    headers: dict[str, Any]
    body: bytes
    content_type: str | None
    content_encoding: str | None


#: Browsing a queue yields each message with a function that removes it for good.
Browsed = Iterator[tuple[StoredMessage, Callable[[], None]]]


class Batch(Protocol):
    """Publishes many messages, collecting their confirms together (:class:`~amqp_events.publisher.ConfirmedBatch`)."""

    def publish(self, message: OutgoingMessage, key: Any = None) -> None: ...

    def wait(self) -> None: ...

    def results(self) -> tuple[list[Any], list[Any], set[str]]: ...

    def close(self) -> None: ...


class Transport(Protocol):
    def publish(self, message: OutgoingMessage) -> bool:
        """Publish ``message`` with a confirm; ``False`` if no queue received it."""

    def batch(self, window: int) -> Batch:
        """A batch publisher with up to ``window`` confirms outstanding."""

    def declare(self, topology: Topology) -> None:
        """Declare a service's topology."""

    def browse(self, queue: str) -> AbstractContextManager[Browsed]:
        """Every message of ``queue``, in order; those not removed stay, in their order."""

    def count(self, queue: str) -> int:
        """Messages in ``queue`` right now."""

    def close(self) -> None: ...


class RabbitMQ:
    """The transport of an app on its broker (``broker_url``)."""

    def __init__(self, app: EventsApp) -> None:
        self.app = app
        self.timeout = app.events_settings.publish_timeout
        self.publisher = Publisher(app, self.timeout)

    def publish(self, message: OutgoingMessage) -> bool:
        return self.publisher.publish(message)

    def batch(self, window: int) -> ConfirmedBatch:
        return ConfirmedBatch(self.app, self.timeout, window)

    def declare(self, topology: Topology) -> None:
        with self.app.connection_for_write() as connection:
            declare_topology(connection, topology)

    @contextmanager
    def browse(self, queue: str) -> Iterator[Browsed]:
        """Fetch every message unacked; whatever is not acked goes back when the channel closes."""
        with self.app.connection_for_write() as connection:
            channel: Any = connection.channel()
            channel.queue_declare(queue, passive=True)  # a clear 404 when it does not exist
            try:
                yield _fetch_all(channel, queue)
            finally:
                channel.close()

    def count(self, queue: str) -> int:
        with self.app.connection_for_write() as connection:
            channel: Any = connection.default_channel
            return int(channel.queue_declare(queue, passive=True).message_count)

    def close(self) -> None:
        self.publisher.close()


def _fetch_all(channel: Any, queue: str) -> Browsed:
    while True:
        fetched = channel.basic_get(queue, no_ack=False)
        if fetched is None:
            return
        body = fetched.body if isinstance(fetched.body, bytes) else str(fetched.body).encode("utf-8")
        stored = StoredMessage(dict(fetched.headers or {}), body, fetched.content_type, fetched.content_encoding)
        yield stored, functools.partial(channel.basic_ack, fetched.delivery_tag)


#: The transport every app uses instead of its broker while the in-process mode is on.
_replacement: Transport | None = None


def replacement() -> Transport | None:
    return _replacement


@contextmanager
def replace_every_broker(transport: Transport) -> Iterator[None]:
    """Inside the block, every app in the process sends to and reads from ``transport`` instead of RabbitMQ."""
    global _replacement
    if _replacement is not None:
        raise RuntimeError("the in-process mode is on already: one at a time")
    _replacement = transport
    try:
        yield
    finally:
        _replacement = None
