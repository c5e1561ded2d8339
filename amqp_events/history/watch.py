"""What the exporter tells of the history: how much it keeps, how old its oldest event is, and whether an
unfinished replay reads events that retention will soon drop."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from amqp_events.errors import TopologyMissing
from amqp_events.history.search import History
from amqp_events.topology.history import max_age_seconds


@dataclass(frozen=True)
class HistoryWatch:
    #: Events in the stream (from the management API; ``None`` without it).
    events: float | None
    #: Seconds since the oldest event kept entered the history (``None``: it is empty).
    oldest_age: float | None
    #: The stream's ``x-max-age`` in seconds (``None``: not known).
    max_age: float | None
    #: Seconds since the event an unfinished replay into the service goes on from entered the history.
    replay_position_age: float | None


def watch(history: History, stream: Mapping[str, Any] | None, now: datetime) -> HistoryWatch | None:
    """The history's state for the exporter, or ``None`` when the vhost has none. ``stream``: the management
    API's record of the stream, if it could be read."""
    try:
        oldest = history.oldest()
    except TopologyMissing:
        return None
    arguments = (stream or {}).get("arguments") or {}
    settings = history.context.settings
    given = arguments.get("x-max-age") or (settings.history_max_age if settings.history else None)
    position_age = None
    try:
        cursor = history.unfinished_replay()
    except TopologyMissing:  # this service never replayed
        cursor = None
    if cursor is not None and cursor.next is not None:
        position = history.event_at(cursor.next)
        position_age = _age(position.at if position else None, now)
    return HistoryWatch(
        events=float(stream["messages"]) if stream and "messages" in stream else None,
        oldest_age=_age(oldest.at if oldest else None, now),
        max_age=max_age_seconds(str(given)) if given else None,
        replay_position_age=position_age,
    )


def _age(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else max(0.0, (now - moment).total_seconds())
