"""Reading a RabbitMQ stream over AMQP 0.9.1: from an offset or a time, up to the last message when reading began.

A stream is consumed like a queue, with a prefetch window (which RabbitMQ
requires) and acks (which only make room in the window: a stream loses nothing
that is read). Each delivery carries its offset in the ``x-stream-offset``
header. Where the stream ends is found first, by reading its last chunk
(``x-stream-offset: last``): the reading stops there, so that a stream still
written to has an end.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from kombu import Connection

from amqp_events.transport.base import StreamReading
from amqp_events.wire.message import StoredMessage

OFFSET = "x-stream-offset"
#: Messages given out at a time (RabbitMQ's credit for the reading consumer).
WINDOW = 2000
#: Deliveries acked at a time (with ``multiple``): fewer frames, and the window never runs dry.
ACK_EVERY = WINDOW // 4
#: Seconds without a delivery after which a stream's last chunk has been read.
LAST_CHUNK_QUIET = 0.3
#: Seconds to wait for the first delivery of the last chunk (none comes when the stream is empty; RabbitMQ tells
#: no count of a stream over AMQP). A loaded node took over 1.5 s to attach the consumer: an empty history pays
#: the wait, a reading of a non-empty one ends as soon as its last chunk has come.
FIRST_DELIVERY = 3.0
#: Seconds without a delivery, while messages up to the end are still expected, after which the reading ends
#: (retention dropped them while they were read, or ``start`` is a time after the last message).
STALLED = 5.0


@contextmanager
def read_stream(connection: Connection, stream: str, start: int | datetime) -> Iterator[StreamReading]:
    connection.ensure_connection()
    channel: Any = connection.channel()
    try:
        channel.queue_declare(stream, passive=True)  # a clear 404 when there is no such stream
        end = _last_offset(connection, channel, stream)
        if end < 0 or (isinstance(start, int) and start > end):
            yield StreamReading(end, iter(()))
            return
        messages = _messages(connection, channel, stream, start, end)
        try:
            yield StreamReading(end, messages)
        finally:
            messages.close()  # a reading left early: its consumer is cancelled before the channel closes
    finally:
        if channel.is_open:
            channel.close()


def _last_offset(connection: Connection, channel: Any, stream: str) -> int:
    offsets: list[int] = []

    def note(message: Any) -> None:
        offsets.append(int(message.headers[OFFSET]))
        channel.basic_ack(message.delivery_tag)

    channel.basic_qos(0, WINDOW, False)
    tag = channel.basic_consume(stream, callback=note, arguments={OFFSET: "last"})
    wait = FIRST_DELIVERY
    while True:
        try:
            connection.drain_events(timeout=wait)
        except TimeoutError:
            break
        wait = LAST_CHUNK_QUIET
    channel.basic_cancel(tag)
    return max(offsets, default=-1)


def _messages(
    connection: Connection, channel: Any, stream: str, start: int | datetime, end: int
) -> Generator[tuple[int, StoredMessage], None, None]:
    delivered: deque[Any] = deque()
    tag = channel.basic_consume(stream, callback=delivered.append, arguments={OFFSET: start})
    try:
        while True:
            while not delivered:
                try:
                    connection.drain_events(timeout=STALLED)
                except TimeoutError:
                    return
            message = delivered.popleft()
            if not delivered or message.delivery_tag % ACK_EVERY == 0:  # acks only make room in the window
                channel.basic_ack(message.delivery_tag, multiple=True)
            offset = int(message.headers[OFFSET])
            if offset > end:
                return
            headers = {key: value for key, value in message.headers.items() if key != OFFSET}
            body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8")
            yield (
                offset,
                StoredMessage(
                    headers,
                    body,
                    message.properties.get("content_type"),  # a message may come without either
                    message.properties.get("content_encoding"),
                    message.properties.get("user_id"),
                ),
            )
            if offset == end:
                return
    finally:
        if channel.is_open:
            channel.basic_cancel(tag)
