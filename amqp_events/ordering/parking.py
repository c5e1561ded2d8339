"""The parked queues of a service's partitions: where the events of a parked key wait, and its marker.

Only the worker consuming a partition (its single active consumer) reads
and writes the partition's parked queue, so what it learns there holds
until it loses the partition. It reads the queue when it first takes a
message of the partition (after each connection), then keeps it up to date
itself. A marker message per parked key gives the head's id; the events
behind it follow in order. Reads take every message and give back those
not removed, in their order (:meth:`~amqp_events.transport.base.Transport.browse`).

A history replay to the ordered handlers closes a *gate* in each partition
before any live event can reach it (:mod:`amqp_events.history.replay`):
until the replay opens it again, the events that did not come from the
replay wait behind it, in the order they came (a parked sequence of its
own, :data:`~amqp_events.ordering.sequences.GATE`), then go on the same
way as a parked key's. So the past of every key runs before its present.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from amqp_events.core.context import ServiceContext
from amqp_events.core.publishing import publish_routed
from amqp_events.metrics import record_parked_keys
from amqp_events.ordering.sequences import GATE, Action, Gate, Sequence, decide, through_gate, without_gate_marks
from amqp_events.topology.names import parked_queue_of, to_queue
from amqp_events.wire.message import EVENT_KEY, OutgoingMessage, StoredMessage
from amqp_events.wire.parked import HELD_LIVE, HOLD_LIVE, PARKED_HEAD, PARKED_SEQ, RELEASED_BEHIND, RELEASED_LAST

logger = logging.getLogger(__name__)


class Parking:
    """The parked keys of the partitions a worker consumes, and the operations on their parked queues.

    Safe to use from several threads: each partition's queue is touched under its own lock.
    """

    def __init__(self, context: Callable[[], ServiceContext]) -> None:
        self._context = context
        self._sequences: dict[str, dict[str, Sequence]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def admit(self, partition: str, key: str, event_id: str, headers: Mapping[str, Any]) -> Action:
        """What to do with a message of ``key`` that ``partition`` gave."""
        with self._partition(partition) as sequences:
            gate = sequences.get(GATE)
            passing = through_gate(gate, headers)
            if passing is Gate.HOLD:
                if gate is None or gate.head != headers[HOLD_LIVE]:
                    self._mark(partition, GATE, str(headers[HOLD_LIVE]), sequences)
                return Action.DONE
            if passing is Gate.OPEN:
                self._release(partition, GATE, sequences)
                return Action.DONE
            if passing is Gate.WAIT:
                return Action.PARK
            if gate is not None and headers.get(RELEASED_BEHIND) == gate.head and headers.get(RELEASED_LAST):
                self._release(partition, GATE, sequences)  # the last one the gate let go: the next ones, or it opens
            return decide(sequences.get(key), event_id, without_gate_marks(gate, headers))

    def park(self, partition: str, key: str, message: StoredMessage) -> None:
        """Append ``message`` to the events waiting behind ``key``'s head, or behind the partition's gate (then
        ack it)."""
        with self._partition(partition) as sequences:
            held = through_gate(sequences.get(GATE), message.headers) is Gate.WAIT
            sequence = sequences[GATE if held else key]
            headers = {name: value for name, value in message.headers.items() if not _obsolete(name)}
            if held:
                headers[HELD_LIVE] = sequence.head
            headers[PARKED_SEQ] = sequence.next_seq
            self._put(partition, StoredMessage(headers, message.body, message.content_type, message.content_encoding))
            sequence.take_seq()
            sequence.parked += 1
            logger.info("event %s of key %r waits in %s", headers.get("id"), key, parked_queue_of(partition))

    def release(self, partition: str, key: str) -> None:
        """``key``'s head was discarded: release what waits behind it."""
        with self._partition(partition) as sequences:
            self._release(partition, key, sequences)

    def ran(self, partition: str, key: str, event_id: str, action: Action, archived: bool, parks: bool) -> None:
        """A message admitted with ``action`` ran: archived (and its handler ``parks``), or handled."""
        with self._partition(partition) as sequences:
            sequence = sequences.get(key)
            if archived:
                if parks and (sequence is None or sequence.head != event_id):
                    self._mark(partition, key, event_id, sequences)
            elif sequence is not None and action in (Action.RUN_HEAD, Action.RUN_LAST):
                self._release(partition, key, sequences)

    def forget(self, partition: str) -> None:
        """Another worker takes ``partition`` over: what is known of it may change."""
        with self._guard:
            self._sequences.pop(partition, None)

    @property
    def context(self) -> ServiceContext:
        """The service's context now (the in-process mode gives an app another one when it starts)."""
        return self._context()

    def parked(self) -> dict[str, dict[str, Sequence]]:
        """The parked keys known, by partition (those of the partitions read since the last connection)."""
        with self._guard:
            return {partition: dict(sequences) for partition, sequences in self._sequences.items()}

    # -- the parked queue ----------------------------------------------------------------------------

    @contextmanager
    def _partition(self, partition: str) -> Iterator[dict[str, Sequence]]:
        with self._guard:
            lock = self._locks.setdefault(partition, threading.Lock())
        with lock:
            sequences = self._sequences.get(partition)
            if sequences is None:
                sequences = self._load(partition)
                with self._guard:
                    self._sequences[partition] = sequences
                record_parked_keys(self.context.name, partition, _keys(sequences))
            yield sequences

    def _load(self, partition: str) -> dict[str, Sequence]:
        sequences: dict[str, Sequence] = {}
        marked: dict[str, int] = {}  # the place of the latest marker of each key
        with self.context.transport.browse(parked_queue_of(partition)) as messages:
            for message, _ in messages:
                key, seq = _sequence_of(message.headers), int(message.headers.get(PARKED_SEQ) or 0)
                head = message.headers.get(PARKED_HEAD)
                sequence = sequences.setdefault(key, Sequence(head or ""))
                sequence.next_seq = max(sequence.next_seq, seq + 1)
                if head is None:
                    sequence.parked += 1
                elif seq >= marked.get(key, -1):  # the latest marker of a key says its head
                    sequence.head, marked[key] = head, seq
        if sequences:
            logger.warning(
                "partition %s: %d key(s) parked behind archived events: %s",
                partition,
                len(sequences),
                ", ".join(f"{key!r} ({sequence.parked} waiting)" for key, sequence in sorted(sequences.items())),
            )
        return sequences

    def _mark(self, partition: str, key: str, head: str, sequences: dict[str, Sequence]) -> None:
        """Park ``key`` behind ``head`` (archived): a marker first, then the older marker of the key goes."""
        sequence = sequences.get(key) or Sequence(head)
        marker = {EVENT_KEY: key, PARKED_HEAD: head, PARKED_SEQ: sequence.next_seq}
        self._put(partition, StoredMessage(marker, b"", "application/octet-stream", "binary"))
        sequence.take_seq()
        if key in sequences:
            self._remove(partition, key, markers=True, keep=head)
        sequence.head = head
        sequences[key] = sequence
        record_parked_keys(self.context.name, partition, _keys(sequences))
        if key == GATE:
            logger.warning("%s: events not from history replay %s wait until it is done", partition, head)
        else:
            logger.warning("key %r parked in %s behind archived event %s", key, partition, head)

    def _release(self, partition: str, key: str, sequences: dict[str, Sequence]) -> None:
        """Send ``key``'s parked events back to ``partition`` in order; with none left, the key goes on."""
        sequence = sequences[key]
        if not sequence.parked:
            self._remove(partition, key, markers=True)
            del sequences[key]
            record_parked_keys(self.context.name, partition, _keys(sequences))
            logger.warning("%s of %s goes on: nothing waits behind %s any more", _named(key), partition, sequence.head)
            return
        with self.context.transport.browse(parked_queue_of(partition)) as messages:
            waiting = sorted(
                (
                    (message, remove)
                    for message, remove in messages
                    if _sequence_of(message.headers) == key and PARKED_HEAD not in message.headers
                ),
                key=lambda found: int(found[0].headers.get(PARKED_SEQ) or 0),
            )
            for number, (message, remove) in enumerate(waiting, 1):
                marks = {RELEASED_BEHIND: sequence.head, **({RELEASED_LAST: True} if number == len(waiting) else {})}
                # Browsing counted each parked copy's deliveries up (x-delivery-count): not the event's own.
                headers = {
                    name: value
                    for name, value in message.headers.items()
                    if not _obsolete(name) and name not in (PARKED_SEQ, HELD_LIVE)
                }
                publish_routed(self.context, outgoing(partition, replace(message, headers=headers), marks))
                remove()
                sequence.parked -= 1
        logger.warning("released %d event(s) of %s parked behind %s", len(waiting), _named(key), sequence.head)

    def _remove(self, partition: str, key: str, markers: bool, keep: str | None = None) -> None:
        with self.context.transport.browse(parked_queue_of(partition)) as messages:
            for message, remove in messages:
                head = message.headers.get(PARKED_HEAD)
                if str(message.headers.get(EVENT_KEY)) == key and (head is not None) == markers and head != keep:
                    remove()

    def _put(self, partition: str, message: StoredMessage) -> None:
        publish_routed(self.context, outgoing(parked_queue_of(partition), message))


def _sequence_of(headers: Mapping[str, Any]) -> str:
    """The parked sequence a message of a parked queue belongs to: its key's, or the gate's."""
    return GATE if HELD_LIVE in headers else str(headers.get(EVENT_KEY))


def _obsolete(header: str) -> bool:
    """Does a message being parked lose this header? The broker's, and the marks of an earlier release."""
    return header.startswith("x-") or header in (RELEASED_BEHIND, RELEASED_LAST)


def _keys(sequences: Mapping[str, Sequence]) -> int:
    """How many keys are parked (the gate is not a key)."""
    return len(sequences) - (GATE in sequences)


def _named(key: str) -> str:
    return "the replay gate" if key == GATE else f"key {key!r}"


def outgoing(queue: str, message: StoredMessage, marks: dict[str, Any] | None = None) -> OutgoingMessage:
    """``message`` published again, straight to ``queue``, with extra headers ``marks``."""
    headers = {**message.headers, **(marks or {})}
    return OutgoingMessage(
        *to_queue(queue),
        headers,
        message.body,
        str(headers.get("id") or uuid.uuid4()),
        message.content_type or "application/octet-stream",
        message.content_encoding or "binary",
    )
