"""The transport of an app on RabbitMQ (``broker_url``): what :mod:`amqp_events.core.transport` asks of a broker."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError

from amqp_events.celery import streams
from amqp_events.celery.publisher import ConfirmedBatchPublisher, Publisher
from amqp_events.core.transport import Browsed, StoredMessage, StreamReading
from amqp_events.errors import PublishError
from amqp_events.topology import Topology
from amqp_events.topology.declare import declare_topology
from amqp_events.wire.message import OutgoingMessage


class RabbitMQ:
    """Publishing with confirms through a connection per thread; declaring, browsing and counting through
    the app's connection pool."""

    def __init__(self, app: Celery, publish_timeout: float) -> None:
        self.app = app
        self.timeout = publish_timeout
        self.publisher = Publisher(app, publish_timeout)
        self.errors: tuple[type[BaseException], ...] = (
            PublishError,
            OperationalError,
            *app.connection_for_write().connection_errors,
        )

    def publish(self, message: OutgoingMessage) -> bool:
        return self.publisher.publish(message)

    def batch(self, window: int) -> ConfirmedBatchPublisher:
        return ConfirmedBatchPublisher(self.app, self.timeout, window)

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

    @contextmanager
    def read_stream(self, stream: str, start: int | datetime) -> Iterator[StreamReading]:
        with self.app.connection_for_write() as connection, streams.read_stream(connection, stream, start) as reading:
            yield reading

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
