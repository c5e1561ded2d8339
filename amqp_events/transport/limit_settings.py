"""A service's limits set at run time, on RabbitMQ: the last message of its stream of limits
(:func:`~amqp_events.topology.limits.limit_settings`), read by every worker and written by ``amqp-events limits set``.

A worker process follows the stream on its flow-control connection (:class:`~amqp_events.transport.leases.Leases`):
it reads the last message when the connection opens, then keeps a consumer on the stream, whose deliveries that
connection reads while it counts runs, so a table written later is in force from a moment after. A stream tells
no count over AMQP 0.9.1: where it ends is found as :mod:`~amqp_events.transport.streams` finds it. The stream is
declared by the first ``limits set``; until then a worker looks for it again now and then, and the limits in force
are the code's.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from amqp import Message
from amqp.exceptions import NotFound
from kombu import Connection, Queue

from amqp_events.transport.streams import FIRST_DELIVERY, LAST_CHUNK_QUIET, OFFSET, read_stream

logger = logging.getLogger(__name__)

#: Seconds between two looks for a stream of limits that is not there yet.
LOOK_AGAIN = 5.0
#: Deliveries of the stream given out before they are acked (acks only make room: a stream loses nothing).
WINDOW = 10


class Following:
    """The last message of ``stream``, kept current on ``connection`` (which its owner reads from one thread at a
    time)."""

    def __init__(self, connection: Connection, stream: str) -> None:
        self.connection = connection
        self.stream = stream
        #: The body of the last message read (``None``: none yet).
        self.latest: bytes | None = None
        self._offset = -1
        self._channel: Any = None
        self._looked = float("-inf")

    def current(self) -> bytes | None:
        """The last table written, as far as this connection has read (looking for the stream again if it was not
        there a while ago)."""
        if self._channel is None and time.monotonic() - self._looked >= LOOK_AGAIN:
            self._follow()
        return self.latest

    def _follow(self) -> None:
        self._looked = time.monotonic()
        channel = self.connection.channel()
        try:
            channel.queue_declare(self.stream, passive=True)
        except NotFound:  # no limit was ever set (the refusal closed the channel)
            return
        channel.basic_qos(0, WINDOW, False)
        channel.basic_consume(self.stream, callback=self._on_message, arguments={OFFSET: "last"})
        self._channel = channel
        wait = FIRST_DELIVERY
        while True:  # its last chunk, read to its end, before the first run is counted
            try:
                self.connection.drain_events(timeout=wait)
            except TimeoutError:
                break
            wait = LAST_CHUNK_QUIET

    def _on_message(self, message: Any) -> None:
        self._channel.basic_ack(message.delivery_tag)
        offset = int(message.headers.get(OFFSET, -1))
        if offset >= self._offset:
            self._offset = offset
            self.latest = message.body if isinstance(message.body, bytes) else str(message.body).encode()


def write_table(connection: Connection, stream: Queue, body: bytes, content_type: str, timeout: float) -> None:
    """Write a table of limits as the stream's last message (declaring the stream and its binding first)."""
    connection.ensure_connection()
    channel: Any = connection.channel()
    try:
        stream(channel).declare()
        channel.confirm_select()
        channel.basic_publish_confirm(
            Message(body, content_type=content_type, content_encoding="utf-8", delivery_mode=2),
            stream.exchange.name,
            stream.routing_key,
            mandatory=True,
            confirm_timeout=timeout,
        )
    finally:
        if channel.is_open:
            channel.close()


def read_table(connection: Connection, stream: str) -> bytes | None:
    """The last table written (``None``: none, or no stream yet)."""
    connection.ensure_connection()
    try:
        with read_stream(connection, stream, 0) as reading:
            if reading.end < 0:
                return None
            last = None
            for _, message in reading.messages:  # the stream keeps little: each message is a whole table
                last = message.body
            return last
    except NotFound:
        return None
