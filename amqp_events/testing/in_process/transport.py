"""The transport of the in-process mode's apps, over its broker in memory (:mod:`amqp_events.transport.memory`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from kombu import Queue
from kombu.serialization import dumps

from amqp_events.errors import PublishRefused
from amqp_events.topology import Topology
from amqp_events.topology.limits import START, Window
from amqp_events.transport.base import AwaitedBatch
from amqp_events.transport.memory import Envelope, MemoryBroker, QueueFull
from amqp_events.transport.publisher import exchange_to_declare
from amqp_events.wire.message import OutgoingMessage


class InProcessTransport:
    """The transport of the apps of an in-process mode: its broker in memory; handlers run once a publish
    from outside a handler returned."""

    errors: tuple[type[BaseException], ...] = ()

    def __init__(self, mode: Any, user: str | None = None) -> None:
        #: The user an app's messages go out as (its broker URL's), verified as the broker would.
        self.mode, self.user = mode, user
        self.broker: MemoryBroker = mode.broker

    def publish(self, message: OutgoingMessage) -> bool:
        routed = self.route(message)
        self.mode.run_due()
        return routed

    def route(self, message: OutgoingMessage) -> bool:
        """Put ``message`` where the broker would, without handling anything yet."""
        envelope = envelope_of(message, self.user)
        exchange = exchange_to_declare(message)
        if exchange is not None:
            self.broker.declare_exchange(exchange)
        try:
            routed = self.broker.publish(envelope)
        except QueueFull as exc:
            raise PublishRefused(f"the broker refused {message.event!r} (nack): {exc}", [message.message_id]) from exc
        self.mode.published(message, envelope, routed)
        return routed

    def batch(self, window: int) -> MemoryBatchPublisher:
        return MemoryBatchPublisher(self)

    async def publish_async(self, message: OutgoingMessage) -> bool:
        return self.publish(message)  # in memory: nothing to wait for

    def batch_async(self, window: int) -> AwaitedBatch:
        return AwaitedBatch(self.batch(window))

    def declare(self, topology: Topology) -> None:
        self.broker.declare(topology)

    def browse(self, queue: str) -> Any:
        return self.broker.browse(queue)

    def count(self, queue: str) -> int:
        return self.broker.count(queue)

    def read_stream(self, stream: str, start: int | datetime) -> Any:
        return self.broker.read_stream(stream, start)

    def hold(self, names: Sequence[str]) -> str | None:
        return self.broker.hold(names)

    def release(self, name: str) -> None:
        self.broker.release(name)

    def admit(self, window: Window) -> bool:
        queue = window.queue  # one start at a time (a byte): the virtual clock does not move between them
        self.broker.declare_queue(queue)
        self.broker.expire()  # the starts older than the window, gone by the virtual clock
        if len(self.broker.queues[queue.name].messages) >= window.count:
            return False  # as full as RabbitMQ would say (its bound counts bytes; each start here is one)
        return self.broker.publish(Envelope({}, START, None, None, {}, queue.exchange.name, queue.routing_key))

    def limit_table(self, stream: str) -> bytes | None:
        messages = self.broker.queues[stream].messages if stream in self.broker.queues else ()
        return messages[-1].body if messages else None

    read_limit_table = limit_table

    def write_limit_table(self, stream: Queue, body: bytes, content_type: str) -> None:
        self.broker.declare_queue(stream)
        self.broker.publish(Envelope({}, body, content_type, "utf-8", {}, stream.exchange.name, stream.routing_key))

    def close(self) -> None:
        pass


class MemoryBatchPublisher:
    """A batch: messages are routed as they are published; handlers run when the batch waits (its end)."""

    def __init__(self, transport: InProcessTransport) -> None:
        self.transport = transport
        self.confirmed: list[Any] = []
        self.returned: set[str] = set()

    def publish(self, message: OutgoingMessage, key: Any = None) -> None:
        if not self.transport.route(message):
            self.returned.add(message.message_id)
        self.confirmed.append(message.message_id if key is None else key)

    def wait(self) -> None:
        self.transport.mode.run_due()

    def results(self) -> tuple[list[Any], list[Any], set[str]]:
        results: tuple[list[Any], list[Any], set[str]] = (self.confirmed, [], self.returned)
        self.confirmed, self.returned = [], set()
        return results

    def close(self) -> None:
        pass


def envelope_of(message: OutgoingMessage, user: str | None = None) -> Envelope:
    """``message`` as it reaches the broker: its body serialised by kombu exactly as a producer does."""
    if message.content_type is None:
        content_type, content_encoding, body = dumps(message.body, serializer="json")
    else:
        content_type, content_encoding, body = message.content_type, message.content_encoding, message.body
    if isinstance(body, str):
        body = body.encode(content_encoding or "utf-8")
    properties = {
        "message_id": message.message_id,
        "delivery_mode": 2,
        "content_type": content_type,
        "content_encoding": content_encoding,
    }
    if user is not None:
        properties["user_id"] = user
    return Envelope(
        dict(message.headers), body, content_type, content_encoding, properties, message.exchange, message.routing_key
    )


class MemoryChannel:
    """Where a consumed message's ack or reject goes: the in-memory queue it came from."""

    no_ack_consumers = None

    def __init__(self, broker: MemoryBroker, queue: str, envelope: Envelope) -> None:
        self.broker, self.queue, self.envelope = broker, queue, envelope
        self.settled = False

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.settled = True

    def basic_reject(self, delivery_tag: int, requeue: bool) -> None:
        self.broker.reject(self.queue, self.envelope, requeue)
        self.settled = True
