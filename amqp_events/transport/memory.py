"""An AMQP broker in memory, on a virtual clock: what the in-process mode of :mod:`amqp_events.testing`
routes messages through.

It models what the library's topology uses of RabbitMQ, from the very kombu
objects a worker declares (:mod:`amqp_events.topology`):

* the default exchange, topic and fanout exchanges, exchange-to-exchange
  bindings and alternate exchanges, matching routing keys with kombu's own
  exchange types;
* mandatory publishing: :meth:`MemoryBroker.publish` says whether a queue
  received the message; an exchange that does not exist is a ``NOT_FOUND``
  error, as on the broker;
* queues with a message TTL (``x-message-ttl``), a length limit
  (``x-max-length``, dropping the oldest or refusing new ones:
  ``x-overflow``) and dead-lettering (``x-dead-letter-exchange`` and
  ``-routing-key``) of expired and rejected messages, with ``x-death``;
* consuming with acks and rejects; a requeued message goes back to the head
  of its queue with ``x-delivery-count`` counted up (quorum queues);
* streams (``x-queue-type: stream``), which keep every message, read by
  offset or arrival time (:meth:`MemoryBroker.read_stream`);
* headers exchanges (``x-match: all``), as the ordered exchanges route by
  slot.

Time is whatever ``now()`` says: :meth:`MemoryBroker.expire` moves the
messages whose TTL ran out by then.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, cast

from kombu import Exchange, Queue
from kombu.transport.virtual.exchange import STANDARD_EXCHANGE_TYPES, DirectExchange, ExchangeType, TopicExchange

from amqp_events.errors import TopologyMissing
from amqp_events.topology import Topology
from amqp_events.transport.base import Browsed, StreamReading
from amqp_events.wire.message import X_DEATH, X_DELIVERY_COUNT, StoredMessage


class QueueFull(Exception):
    """A queue with ``x-overflow: reject-publish`` is at its length limit: the broker refuses the message."""


@dataclass
class Envelope:
    """A message on its way through the broker: in a queue, or being consumed."""

    headers: dict[str, Any]
    body: bytes
    content_type: str | None
    content_encoding: str | None
    properties: dict[str, Any]
    #: How it was last published (or dead-lettered): what a consumer sees in ``delivery_info``.
    exchange: str
    routing_key: str
    redelivered: bool = False
    #: Arrival order over every queue (also the delivery tag).
    seq: int = 0
    enqueued_at: datetime | None = None

    def stored(self) -> StoredMessage:
        return StoredMessage(
            self.headers,
            self.body,
            self.content_type,
            self.content_encoding,
            self.properties.get("user_id"),
            self.exchange,
            self.routing_key,
        )


@dataclass
class MemoryQueue:
    name: str
    arguments: dict[str, Any]
    messages: deque[Envelope] = field(default_factory=deque)

    @property
    def ttl(self) -> timedelta | None:
        ttl = self.arguments.get("x-message-ttl")
        return timedelta(milliseconds=ttl) if ttl else None

    @property
    def dead_letter_exchange(self) -> str | None:
        return self.arguments.get("x-dead-letter-exchange")

    def head_expires_at(self) -> datetime | None:
        if not self.messages:
            return None
        ttl = self.ttl
        if ttl is None:
            return None
        enqueued_at = self.messages[0].enqueued_at
        return None if enqueued_at is None else enqueued_at + ttl


@dataclass(frozen=True)
class Route:
    """A binding: ``destination`` (a queue, or an exchange when ``to_exchange``) gets what matches ``key``."""

    key: str
    pattern: Any
    destination: tuple[bool, str]  # (to_exchange, name)
    #: What a headers exchange's binding matches.
    arguments: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


class AmqpTopicExchange(TopicExchange):
    """kombu's topic exchange, with RabbitMQ's ``*``: one word. Before kombu 5.7 it could match several."""

    wildcards = {**TopicExchange.wildcards, "*": r"[^\.]+"}  # noqa: RUF012  # kombu's attribute, as kombu types it

    def key_to_pattern(self, rkey: str) -> str:
        return _topic_pattern(rkey)


@functools.lru_cache(maxsize=4096)
def _topic_pattern(routing_key: str) -> str:
    """kombu's pattern of a topic binding's key, made once: every in-process run binds the same keys again (the
    delay ladders), and making one costs more than the rest of a binding."""
    pattern: str = TopicExchange.key_to_pattern(_AMQP_TOPIC, routing_key)
    return pattern


_AMQP_TOPIC = cast(Any, AmqpTopicExchange)(None)  # kombu's exchange types take the channel they serve


class MemoryBroker:
    """Exchanges, queues and bindings in memory; every method runs at once, in the caller's thread."""

    def __init__(self, now: Callable[[], datetime]) -> None:
        self.now = now
        self.exchanges: dict[str, tuple[str, dict[str, Any]]] = {}
        self.queues: dict[str, MemoryQueue] = {}
        self.routes: dict[str, list[Route]] = {}
        self._bound: set[tuple[str, str, tuple[bool, str]]] = set()  # (exchange, key, destination): bound once
        #: What each (exchange, routing key) of a direct, fanout or topic exchange routes to, until the next binding:
        #: a topic exchange matches every binding's pattern, and a delay ladder has some fifty.
        self._looked_up: dict[tuple[str, str], Collection[tuple[bool, str]]] = {}
        # A headers exchange binds like a direct one; it routes by the headers its bindings match (:meth:`_route`).
        types: dict[str, Any] = {**STANDARD_EXCHANGE_TYPES, "topic": AmqpTopicExchange, "headers": DirectExchange}
        self._types: dict[str, ExchangeType] = {name: kind(None) for name, kind in types.items()}
        self._seq = itertools.count(1)
        #: The exclusive queues flow control's leases are (the in-process mode is one connection: a name held is
        #: held until given back).
        self.leases: set[str] = set()

    # -- declaring ----------------------------------------------------------------------------------

    def declare(self, topology: Topology) -> None:
        """Declare a service's exchanges, queues and bindings (what exists already is kept)."""
        for exchange in topology.exchanges:
            self.declare_exchange(exchange)
        for queue in topology.queues:
            self.declare_queue(queue)
        for binding in topology.bindings:
            destination = (binding.to_exchange, binding.destination.name)
            self._bind(binding.source.name, binding.routing_key, destination, binding.arguments)

    def declare_queue(self, queue: Queue) -> None:
        """Declare ``queue`` and its binding to its exchange (one that exists is kept)."""
        if queue.name not in self.queues:
            self.queues[queue.name] = MemoryQueue(queue.name, dict(getattr(queue, "queue_arguments", None) or {}))
        if queue.exchange is not None and queue.exchange.name:
            self.declare_exchange(queue.exchange)
            self._bind(
                queue.exchange.name, queue.routing_key, (False, queue.name), getattr(queue, "binding_arguments", None)
            )

    def declare_exchange(self, exchange: Exchange) -> None:
        if exchange.name not in self.exchanges:
            self.exchanges[exchange.name] = (exchange.type, dict(getattr(exchange, "arguments", None) or {}))

    def _bind(
        self, exchange: str, routing_key: str, destination: tuple[bool, str], arguments: dict[str, Any] | None = None
    ) -> None:
        if (exchange, routing_key, destination) in self._bound:
            return
        kind = self._types[self.exchanges[exchange][0]]
        key, pattern, _ = kind.prepare_bind(destination, exchange, routing_key, None)
        self._bound.add((exchange, routing_key, destination))
        self._looked_up.clear()
        self.routes.setdefault(exchange, []).append(Route(key, pattern, destination, dict(arguments or {})))

    def hold(self, names: Sequence[str]) -> str | None:
        """The first of ``names`` not held, now held (an exclusive queue's declaration); ``None``: each is."""
        for name in names:
            if name not in self.leases:
                self.leases.add(name)
                return name
        return None

    def release(self, name: str) -> None:
        """Give back the lease ``name`` (its exclusive queue deleted)."""
        self.leases.discard(name)

    # -- publishing ---------------------------------------------------------------------------------

    def publish(self, envelope: Envelope) -> bool:
        """Route ``envelope`` by its exchange and routing key; ``True`` if a queue received it."""
        queues = self._route(envelope.exchange, envelope.routing_key, frozenset(), envelope.headers)
        full = [name for name in queues if self._refuses(self.queues[name])]
        if full:
            raise QueueFull(f"queue(s) {', '.join(full)} at their length limit refuse new messages")
        for name in sorted(queues):
            self._enqueue(self.queues[name], replace(envelope, headers=copy.deepcopy(envelope.headers)))
        return bool(queues)

    def _route(self, exchange: str, routing_key: str, seen: frozenset[str], headers: dict[str, Any]) -> set[str]:
        if exchange == "":  # the default exchange: straight to the queue of that name
            return {routing_key} if routing_key in self.queues else set()
        if exchange not in self.exchanges:
            raise TopologyMissing(f"NOT_FOUND - no exchange '{exchange}' in vhost")
        kind, arguments = self.exchanges[exchange]
        routes = self.routes.get(exchange, [])
        found: Collection[tuple[bool, str]]  # (to an exchange?, name): kombu's lookup gives a set
        if kind == "headers":
            found = [route.destination for route in routes if _all_match(route.arguments, headers)]
        else:
            if (exchange, routing_key) not in self._looked_up:
                table = [(route.key, route.pattern, route.destination) for route in routes]
                self._looked_up[exchange, routing_key] = self._types[kind].lookup(table, exchange, routing_key, None)
            found = self._looked_up[exchange, routing_key]
        queues: set[str] = set()
        for to_exchange, name in found:
            if not to_exchange:
                queues.add(name)
            elif name not in seen and name in self.exchanges:
                queues |= self._route(name, routing_key, seen | {exchange}, headers)
        alternate = arguments.get("alternate-exchange")
        if not queues and alternate and alternate not in seen:
            queues = self._route(alternate, routing_key, seen | {exchange}, headers)
        return queues

    def _refuses(self, queue: MemoryQueue) -> bool:
        limit = queue.arguments.get("x-max-length")
        return (
            limit is not None and queue.arguments.get("x-overflow") == "reject-publish" and len(queue.messages) >= limit
        )

    def _enqueue(self, queue: MemoryQueue, envelope: Envelope) -> None:
        envelope.seq, envelope.enqueued_at = next(self._seq), self.now()
        queue.messages.append(envelope)
        limit = queue.arguments.get("x-max-length")
        while limit and len(queue.messages) > limit:  # drop-head, the default overflow
            self._dead_letter(queue, queue.messages.popleft(), "maxlen")

    # -- time passing -------------------------------------------------------------------------------

    def next_expiry(self, dead_lettering_only: bool = False) -> datetime | None:
        """When the next message's TTL runs out (only in queues that pass it on, if asked)."""
        times = [
            expires
            for queue in self.queues.values()
            if not dead_lettering_only or queue.dead_letter_exchange
            if (expires := queue.head_expires_at()) is not None
        ]
        return min(times, default=None)

    def expire(self) -> None:
        """Dead-letter (or drop) every message whose TTL ran out by now, earliest first."""
        while True:
            due = [
                (expires, queue.messages[0].seq, queue)
                for queue in self.queues.values()
                if (expires := queue.head_expires_at()) is not None and expires <= self.now()
            ]
            if not due:
                return
            _, _, queue = min(due, key=lambda entry: (entry[0], entry[1]))
            self._dead_letter(queue, queue.messages.popleft(), "expired")

    def _dead_letter(self, queue: MemoryQueue, envelope: Envelope, reason: str) -> None:
        exchange = queue.dead_letter_exchange
        if not exchange:
            return  # dropped, as RabbitMQ does without a dead-letter exchange
        headers = with_death(envelope.headers, queue.name, reason, envelope.exchange, envelope.routing_key, self.now())
        routing_key = queue.arguments.get("x-dead-letter-routing-key") or envelope.routing_key
        dead = replace(envelope, headers=headers, exchange=exchange, routing_key=routing_key, redelivered=False)
        self.publish(dead)  # a dead letter no queue takes is dropped

    # -- consuming ----------------------------------------------------------------------------------

    def oldest(self, queues: Iterator[str] | list[str]) -> tuple[str, Envelope] | None:
        """The message that arrived first among ``queues``, taken off its queue (unacked), if any."""
        heads = [(self.queues[name].messages[0].seq, name) for name in queues if self.queues[name].messages]
        if not heads:
            return None
        _, name = min(heads)
        return name, self.queues[name].messages.popleft()

    def reject(self, queue: str, envelope: Envelope, requeue: bool) -> None:
        """A consumer gave ``envelope`` back: to the head of its queue, or to the dead-letter exchange."""
        if requeue:
            headers = {**envelope.headers, X_DELIVERY_COUNT: int(envelope.headers.get(X_DELIVERY_COUNT) or 0) + 1}
            self.queues[queue].messages.appendleft(replace(envelope, headers=headers, redelivered=True))
        else:
            self._dead_letter(self.queues[queue], envelope, "rejected")

    # -- reading ------------------------------------------------------------------------------------

    @contextmanager
    def browse(self, queue: str) -> Iterator[Browsed]:
        if queue not in self.queues:
            raise TopologyMissing(f"NOT_FOUND - no queue '{queue}' in vhost")
        messages = self.queues[queue].messages

        def removing(envelope: Envelope) -> Callable[[], None]:
            return lambda: messages.remove(envelope)

        yield ((envelope.stored(), removing(envelope)) for envelope in list(messages))

    @contextmanager
    def read_stream(self, stream: str, start: int | datetime) -> Iterator[StreamReading]:
        """A stream's messages from an offset (its index: nothing is ever dropped here) or an arrival time."""
        if stream not in self.queues:
            raise TopologyMissing(f"NOT_FOUND - no queue '{stream}' in vhost")
        messages = list(self.queues[stream].messages)
        yield StreamReading(
            len(messages) - 1,
            (
                (offset, envelope.stored())
                for offset, envelope in enumerate(messages)
                if (offset >= start if isinstance(start, int) else (envelope.enqueued_at or start) >= start)
            ),
        )

    def count(self, queue: str) -> int:
        if queue not in self.queues:
            raise TopologyMissing(f"NOT_FOUND - no queue '{queue}' in vhost")
        return len(self.queues[queue].messages)


def _all_match(binding: dict[str, Any], headers: dict[str, Any]) -> bool:
    """Does a headers exchange's ``x-match: all`` binding match these headers (``all-with-x``: the ``x-``
    headers too)?"""
    with_x = binding.get("x-match") == "all-with-x"
    return all(
        headers.get(name) == value
        for name, value in binding.items()
        if name != "x-match" and (with_x or not name.startswith("x-"))
    )


def with_death(
    headers: dict[str, Any], queue: str, reason: str, exchange: str, routing_key: str, now: datetime
) -> dict[str, Any]:
    """``headers`` with the ``x-death`` entry RabbitMQ adds when ``queue`` dead-letters a message.

    One entry per queue and reason, the latest first, counting how often it happened.
    """
    deaths = [dict(death) for death in headers.get(X_DEATH) or []]
    earlier = next((death for death in deaths if death.get("queue") == queue and death.get("reason") == reason), None)
    if earlier is not None:
        deaths.remove(earlier)
    entry = {
        "count": (earlier or {}).get("count", 0) + 1,
        "reason": reason,
        "queue": queue,
        "time": now,
        "exchange": exchange,
        "routing-keys": [routing_key],
    }
    first = {
        "x-first-death-queue": queue,
        "x-first-death-reason": reason,
        "x-first-death-exchange": exchange,
    }
    return {**first, **headers, X_DEATH: [entry, *deaths]}
