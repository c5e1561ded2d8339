"""Catching up from the history: past events delivered to one service's handlers, resumable, at a bounded rate.

A replay publishes each event it takes straight to the service's own queue
of that event (its ordered exchange for an ordered handler), so no other
service gets a copy; up to 100 at a time in one message, a replay batch
(:mod:`amqp_events.wire.batch`), which a worker takes as one. It first declares the service's topology, so that
every event fired from then on reaches the service live: the replay goes
on to the last event in the history at its start, and the two overlap a
little. A handler with an inbox runs an event it got both ways once.

How far a replay got is kept on the broker, in the service's quorum queue
``<service>.history.cursor`` (its newest message; the queue holds one):
the offset after the last event whose copy the broker confirmed. The same
replay started again goes on from there.
"""

from __future__ import annotations

import getpass
import json
import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

from amqp_events.core.context import ServiceContext
from amqp_events.core.handler import Handler
from amqp_events.errors import BadArguments, PublishError, TopologyMissing
from amqp_events.history import gates
from amqp_events.history.records import HistoricEvent, NamesOf, Query, events_in, start_of
from amqp_events.inbox.base import effect_stores
from amqp_events.topology import service_topology
from amqp_events.topology.names import (
    HISTORY_STREAM,
    history_cursor_queue_name,
    ordered_exchange_name,
    slot_of,
    to_queue,
)
from amqp_events.transport.base import BatchPublisher
from amqp_events.wire import batch
from amqp_events.wire.message import (
    EVENT_KEY,
    EVENT_SLOT,
    FOR_HANDLER,
    JSON,
    OutgoingMessage,
    copy_headers,
    event_key,
)
from amqp_events.wire.parked import HISTORY_REPLAY

logger = logging.getLogger(__name__)

#: Seconds between the service's topology being declared and the end of the history being read: what an event
#: routed just before the declaration takes to be written to the stream (so the two overlap instead of leaving a gap).
SEAM_GRACE = 1.0
#: Called with the offset reached and the history's last offset.
Progress = Callable[[int, int], None]
#: Copies sent between two waits for the broker's confirms (and two records of the cursor).
CHECKPOINT = 1000


@dataclass(frozen=True)
class Cursor:
    """How far a replay into a service got: the record kept in ``<service>.history.cursor``."""

    replay: str
    #: The replay's window and handler (a replay started again with the same ones goes on from ``next``).
    query: dict[str, Any]
    handler: str | None
    #: The offset to go on from.
    next: int | None
    replayed: int = 0
    done: bool = False

    def resumes(self, query: Query, handler: str | None) -> bool:
        """Is it the record of an interrupted run of this replay? The same one, or one that starts no earlier
        (``--since 7D`` run again a little later: what it adds was replayed already)."""
        if self.done or self.next is None or handler != self.handler:
            return False
        wanted = _query_record(query)
        since, began = wanted.pop("since"), self.query.get("since")
        same = wanted == {name: value for name, value in self.query.items() if name != "since"}
        return same and (
            began is None or (since is not None and datetime.fromisoformat(since) >= datetime.fromisoformat(began))
        )


@dataclass
class HistoryReplayReport:
    replay: str
    #: Events sent to the service's queues (this run and earlier runs of the same replay).
    replayed: int = 0
    #: The offset it went on from, when it went on from an interrupted run.
    resumed_from: int | None = None
    #: The offset of the history's last event when the replay began (-1: the history was empty).
    end: int = -1
    #: Its ordered handlers' partitions existed before it began: events handled before may have run before older
    #: ones it replayed.
    partitions_existed: bool = False


class HistoryReplay:
    """Past events of the history, replayed to ``context``'s service (only to ``handler``, if given).

    ``rate``: events per second at most (0: as fast as the broker confirms).
    ``restart``: start over even if the same replay was interrupted before.
    """

    def __init__(
        self,
        context: ServiceContext,
        query: Query,
        handler: str | None = None,
        rate: float = 1000.0,
        restart: bool = False,
        replayed_by: str = "",
    ) -> None:
        self.context, self.query, self.rate, self.restart = context, query, rate, restart
        self.handler = handler
        self.targets = _targets(context, handler)
        self.by_event: dict[str, list[Handler]] = {}
        for target in self.targets:
            self.by_event.setdefault(target.event, []).append(target)
        self.names = NamesOf(context)
        self.by = replayed_by or f"{getpass.getuser()}@{socket.gethostname()}"
        self.cursor_queue = history_cursor_queue_name(context.name)

    @property
    def without_inbox(self) -> list[Handler]:
        """The handlers it replays to that would run an event again (no inbox remembers what they did)."""
        return [handler for handler in self.targets if not any(effect_stores(handler))]

    def run(self, progress: Progress | None = None) -> HistoryReplayReport:
        """Replay; ``progress(offset, end)`` is called as the reading goes through the history."""
        context = self.context
        transport = context.transport
        transport.count(HISTORY_STREAM)  # a clear 404 when no service keeps a history on this vhost
        settings = replace(context.settings, history=True)
        topology = service_topology(context.name, context.handlers, settings, self._ordered_events())
        ordered = next((handler for handler in self.targets if handler.ordered), None)
        existed = ordered is not None and gates.partitions_existed(context)
        transport.declare(gates.without_live_events(topology))
        cursor = None if self.restart else read_cursor(context)
        if cursor is not None and cursor.resumes(self.query, self.handler):
            report = HistoryReplayReport(cursor.replay, cursor.replayed, resumed_from=cursor.next)
            start: int | datetime = cursor.next or 0
        else:
            report = HistoryReplayReport(uuid.uuid4().hex[:12])
            start = start_of(self.query)
        report.partitions_existed = existed
        logger.warning(
            "history replay %s into %s by %s, from %s%s",
            report.replay,
            context.name,
            self.by,
            start,
            "" if report.resumed_from is None else " (going on after an interruption)",
        )
        if ordered is not None:
            gates.close_gates(context, ordered, report.replay)
        transport.declare(topology)
        time.sleep(SEAM_GRACE)
        batch = transport.batch(CHECKPOINT)
        try:
            self._replay(batch, start, report, progress)
        finally:
            batch.close()
        if ordered is not None:
            gates.open_gates(context, ordered, report.replay)
        return report

    def _replay(
        self,
        batch: BatchPublisher,
        start: int | datetime,
        report: HistoryReplayReport,
        progress: Progress | None,
    ) -> None:
        began, sent = time.monotonic(), 0
        next_offset = start if isinstance(start, int) else None
        batches = Batches(batch, report.replay)
        with self.context.transport.read_stream(HISTORY_STREAM, start) as reading:
            report.end = reading.end
            for event in events_in(reading.messages, self.query, self.names, self.context.identity):
                next_offset = event.offset + 1
                if progress:
                    progress(event.offset, reading.end)
                for handler in self.by_event.get(event.event, ()):
                    copy = replayed_copy(event, self.context.name, handler, report.replay)
                    if handler.ordered or not batches.add(handler, copy):
                        batches.publish_alone(copy)
                    sent += 1
                pause = ahead_of_rate(sent, self.rate, time.monotonic() - began)
                if pause:
                    time.sleep(pause)
                if sent % CHECKPOINT == 0:
                    report.replayed += batches.confirmed()
                    self._record(report, next_offset, done=False)
        report.replayed += batches.confirmed()
        self._record(report, next_offset, done=True)

    def _record(self, report: HistoryReplayReport, next_offset: int | None, done: bool) -> None:
        cursor = Cursor(report.replay, _query_record(self.query), self.handler, next_offset, report.replayed, done)
        body = json.dumps(asdict(cursor)).encode("utf-8")
        message = OutgoingMessage(*to_queue(self.cursor_queue), {}, body, report.replay, "application/json", "utf-8")
        if not self.context.transport.publish(message):
            raise TopologyMissing(f"the queue {self.cursor_queue!r} is gone: the replay cannot record how far it got")

    def _ordered_events(self) -> list[str]:
        return [event for event, handler in self.context.handlers.items() if handler.ordered]


def ahead_of_rate(sent: int, rate: float, elapsed: float) -> float:
    """Seconds to wait so that ``sent`` events in ``elapsed`` seconds keep to ``rate`` per second (0: none, or no
    rate). Never negative: the clock read once (read twice, a busy machine made the wait a negative sleep)."""
    return max(0.0, sent / rate - elapsed) if rate else 0.0


def read_cursor(context: ServiceContext, service: str | None = None) -> Cursor | None:
    """The newest record of ``<service>.history.cursor`` (of ``context``'s service, or of ``service``: nothing is
    taken off it); ``None`` without one."""
    found = None
    with context.transport.browse(history_cursor_queue_name(service or context.name)) as messages:
        for message, _ in messages:
            try:
                found = Cursor(**json.loads(message.body))
            except (ValueError, TypeError):
                found = None  # not a record of ours: start over
    return found


def replayed_copy(event: HistoricEvent, service: str, handler: Handler, replay: str) -> OutgoingMessage:
    """What a replay publishes: the event as it was fired, to ``handler``'s queue (or ordered exchange) alone."""
    message = event.message
    # Named: a service queue its event's other handlers share (per_service) would give it to each of them.
    headers = copy_headers(message.headers, retries=0, **{HISTORY_REPLAY: replay, FOR_HANDLER: handler.task_name})
    exchange, routing_key = (
        (ordered_exchange_name(service), event.event) if handler.ordered else to_queue(handler.queue)
    )
    if handler.ordered and EVENT_SLOT not in headers:
        headers.update(_key_and_slot(event, handler))
    return OutgoingMessage(
        exchange=exchange,
        routing_key=routing_key,
        headers=headers,
        body=message.body,
        message_id=event.id or f"{replay}-{event.offset}",
        content_type=message.content_type or "application/octet-stream",
        content_encoding=message.content_encoding or "binary",
    )


def _key_and_slot(event: HistoricEvent, handler: Handler) -> dict[str, str]:
    """The key and slot of an event fired without a slot (so that it does not take the intake's way round, past
    the replay's gate); nothing when its arguments give no key (a worker archives it, as a live one)."""
    try:
        key = event_key(
            event.key if event.key is not None else handler.key_of(tuple(event.args or ()), event.kwargs or {})
        )
    except (BadArguments, ValueError):
        return {}
    return {EVENT_KEY: key, EVENT_SLOT: slot_of(key)}


def _targets(context: ServiceContext, handler: str | None) -> list[Handler]:
    """The service's handlers a replay sends to: all of them, or those called ``handler`` (the function's name,
    its full name, its event or the name it was registered with)."""
    handlers = context.handlers
    if not handlers:
        raise LookupError(f"service {context.name!r} has no handler: a replay has nothing to deliver to")
    if handler is None:
        return list(handlers.values())
    found = [
        candidate
        for task, candidate in handlers.items()
        if handler in (candidate.name, candidate.name.rpartition(".")[2], task, candidate.event, candidate.label)
    ]
    if not found:
        names = ", ".join(sorted(candidate.name for candidate in handlers.values())) or "none"
        raise LookupError(f"service {context.name!r} has no handler {handler!r} (its handlers: {names})")
    return found


class Batches:
    """The copies a replay sends, gathered into replay batches per handler queue (:mod:`amqp_events.wire.batch`):
    a worker takes a batch as one message and runs its events one by one. An event that cannot go into a batch
    (an ordered handler's, one not in the library's JSON form) is sent alone."""

    def __init__(self, publisher: BatchPublisher, replay: str) -> None:
        self.publisher, self.replay = publisher, replay
        #: Per handler (its queue and task name): the event and the entries gathered, and their size in bytes.
        self.gathered: dict[tuple[str, str], tuple[str, list[bytes], int]] = {}
        #: Events sent whose confirms were not counted yet.
        self.unconfirmed = 0

    def add(self, handler: Handler, copy: OutgoingMessage) -> bool:
        """Gather ``copy`` into its handler's next batch; ``False`` if it must be sent alone."""
        entry = batch.entry(copy.headers, copy.body) if copy.content_type == JSON else None
        if entry is None:
            return False
        to = (copy.routing_key, handler.task_name)
        event, entries, size = self.gathered.get(to) or (handler.event, [], 0)
        if entries and size + len(entry) > batch.MAX_BYTES:
            self._send(to)
            entries, size = [], 0
        entries.append(entry)
        self.gathered[to] = (event, entries, size + len(entry))
        if len(entries) >= batch.MAX_EVENTS:
            self._send(to)
        return True

    def publish_alone(self, copy: OutgoingMessage) -> None:
        self.publisher.publish(copy)
        self.unconfirmed += 1

    def confirmed(self) -> int:
        """Send what is gathered, wait for every confirm; returns the events they carried."""
        for to in list(self.gathered):
            self._send(to)
        self.publisher.wait()
        _, refused, returned = self.publisher.results()
        if refused:
            raise PublishError(f"the broker refused {len(refused)} replayed message(s) (nack): the replay stops")
        if returned:
            raise TopologyMissing(
                f"{len(returned)} replayed message(s) reached no queue: was a queue of the service deleted?"
            )
        events, self.unconfirmed = self.unconfirmed, 0
        return events

    def _send(self, to: tuple[str, str]) -> None:
        event, entries, _ = self.gathered.pop(to)
        queue, task = to
        headers = {HISTORY_REPLAY: self.replay, FOR_HANDLER: task}
        self.publisher.publish(batch.batch_message(queue, event, entries, headers))
        self.unconfirmed += len(entries)


def _query_record(query: Query) -> dict[str, Any]:
    return {
        "since": query.since.isoformat() if query.since else None,
        "until": query.until.isoformat() if query.until else None,
        "events": query.events,
        "where": dict(query.where),
    }
