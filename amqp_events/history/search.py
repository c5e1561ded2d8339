"""Looking back: the events the history keeps, found by time, name and arguments, and counted."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from amqp_events.core.context import ServiceContext
from amqp_events.history.records import HistoricEvent, NamesOf, Query, events_in, start_of
from amqp_events.history.replay import Cursor, HistoryReplay, read_cursor
from amqp_events.topology.names import HISTORY_STREAM

EVERY_EVENT = Query()


@dataclass
class Stats:
    """What ``history stats`` reports."""

    events: int = 0
    #: Bodies and headers of the events kept (on disk each takes a few dozen bytes more).
    bytes: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    oldest: datetime | None = None
    newest: datetime | None = None
    #: Events per name per hour (``YYYY-MM-DDTHH:00``).
    per_hour: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, event: HistoricEvent) -> None:
        message = event.message
        self.events += 1
        self.bytes += len(message.body) + len(json.dumps(message.headers, default=str))
        if self.first_offset is None:
            self.first_offset = event.offset
        self.last_offset = event.offset
        at = event.at
        if at is not None:
            self.oldest = at if self.oldest is None else min(self.oldest, at)
            self.newest = at if self.newest is None else max(self.newest, at)
            self.per_hour[(event.event, at.strftime("%Y-%m-%dT%H:00"))] += 1

    def to_json(self) -> dict[str, object]:
        return {
            "events": self.events,
            "bytes": self.bytes,
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "oldest": self.oldest.isoformat() if self.oldest else None,
            "newest": self.newest.isoformat() if self.newest else None,
            "per_hour": [
                {"event": event, "hour": hour, "events": count}
                for (event, hour), count in sorted(self.per_hour.items())
            ],
        }


class History:
    """The vhost's history (``amqp_events.history``) as ``context``'s service reads it.

    Get one with :meth:`amqp_events.celery.EventsApp.history`. Reading never
    changes the history: a stream loses nothing that is read.
    """

    def __init__(self, context: ServiceContext, declared: dict[str, Sequence[str]] | None = None) -> None:
        self.context = context
        self.names = NamesOf(context, declared)

    def find(self, query: Query = EVERY_EVENT, limit: int | None = None) -> list[HistoricEvent]:
        """The events ``query`` takes, oldest first (at most ``limit``)."""
        found: list[HistoricEvent] = []
        with self.context.transport.read_stream(HISTORY_STREAM, start_of(query)) as reading:
            for event in events_in(reading.messages, query, self.names, self.context.identity):
                found.append(event)
                if limit is not None and len(found) >= limit:
                    break
        return found

    def show(self, event_id: str) -> list[HistoricEvent]:
        """Every copy of the event with this id in the history (more than one if it was fired twice)."""
        return self.find(Query(where={"id": event_id}))

    def replay(
        self,
        query: Query,
        handler: str | None = None,
        rate: float = 1000.0,
        restart: bool = False,
        replayed_by: str = "",
    ) -> HistoryReplay:
        """A replay of the events ``query`` takes to this service's handlers (see :class:`HistoryReplay`):
        call its ``run()``."""
        return HistoryReplay(self.context, query, handler, rate, restart, replayed_by)

    def oldest(self) -> HistoricEvent | None:
        """The oldest event the history keeps (``None``: it is empty)."""
        return self.event_at(0)

    def event_at(self, offset: int) -> HistoricEvent | None:
        """The event at ``offset``, or the first one after it that the history keeps."""
        with self.context.transport.read_stream(HISTORY_STREAM, offset) as reading:
            for found, message in reading.messages:
                return HistoricEvent.read(found, message, self.context.identity)
        return None

    def unfinished_replay(self) -> Cursor | None:
        """The record of a replay into this service that has not finished (running, or interrupted)."""
        cursor = read_cursor(self.context)
        return cursor if cursor is not None and not cursor.done else None

    def stats(self) -> Stats:
        stats = Stats()
        with self.context.transport.read_stream(HISTORY_STREAM, 0) as reading:
            for offset, message in reading.messages:
                stats.add(HistoricEvent.read(offset, message, self.context.identity))
        return stats
