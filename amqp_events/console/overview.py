"""The fleet at a glance: one row per service, what is wrong with it, the services with a problem first. Pure.

A row is made of what the console already read: the service's queues (the
management API), its archive's snapshot (:mod:`amqp_events.console.index`) and
its workers' heartbeats. Ordered partitions and other internal queues are
folded into one line each, under the handlers' queues.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from amqp_events.console.discovery import QueueState, ServiceQueues
from amqp_events.console.index import Snapshot
from amqp_events.history.replay import Cursor
from amqp_events.topology.names import is_event_queue, queue_kind

#: How each kind of a service's queue is folded (event queues stay one line each).
FOLDED = {"partition": "ordered partitions", "parked": "parked keys", "main": "internal"}


@dataclass(frozen=True)
class ServiceRow:
    name: str
    handled_per_minute: float | None
    failed_per_minute: float | None
    archived: int
    oldest_archived: datetime | None
    groups: int
    backlog: int
    workers: int
    breakers_open: tuple[str, ...]
    unhealthy: tuple[str, ...]
    queues: tuple[QueueState, ...]
    archive_read_at: datetime | None
    #: Its latest history replay, in words (``None``: it had none).
    history_replay: str | None = None
    #: Why the console could not read its archive (its user may not), if it could not.
    archive_unreadable: str | None = None
    problems: tuple[str, ...] = field(default=())

    def summary(self) -> dict[str, Any]:
        return {
            "service": self.name,
            "handled_per_minute": self.handled_per_minute,
            "failed_per_minute": self.failed_per_minute,
            "archived": self.archived,
            "oldest_archived": self.oldest_archived.isoformat() if self.oldest_archived else None,
            "groups": self.groups,
            "backlog": self.backlog,
            "workers": self.workers,
            "breakers_open": list(self.breakers_open),
            "unhealthy": list(self.unhealthy),
            "archive_read_at": self.archive_read_at.isoformat() if self.archive_read_at else None,
            "history_replay": self.history_replay,
            "archive_unreadable": self.archive_unreadable,
            "problems": list(self.problems),
        }


def service_row(
    service: ServiceQueues,
    snapshot: Snapshot | None,
    beats: Mapping[str, Mapping[str, Any]],
    archive_rate: float | None,
    replay: Cursor | None = None,
    unreadable: str | None = None,
    now: datetime | None = None,
) -> ServiceRow:
    """The row of ``service``: ``archive_rate`` is messages per second into its archive (its failures) as the
    management API last sampled it, ``replay`` the record of its latest history replay; ``now``: what the archived
    of the last minute are counted to."""
    handling = [queue for queue in service.queues if queue_kind(queue.name, service.name) != "parked"]
    # No stats yet (nothing went through its queues since the broker started): none handled, as 0.0, not unknown.
    handled = _sum(queue.acked for queue in handling) or (0.0 if handling else None)
    archived_per_minute = _archived_in_the_last_minute(snapshot, now) if snapshot is not None else None
    if archived_per_minute is None and archive_rate is not None:
        archived_per_minute = archive_rate * 60
    open_breakers = sorted(
        {
            handler
            for beat in beats.values()
            for handler, state in (beat.get("breakers") or {}).items()
            if state != "closed"
        }
    )
    unhealthy = sorted(
        {check for beat in beats.values() for check, state in (beat.get("health") or {}).items() if state != "healthy"}
    )
    row = ServiceRow(
        name=service.name,
        handled_per_minute=None if handled is None else handled * 60,
        failed_per_minute=archived_per_minute,
        archived=snapshot.count if snapshot else service.archived,
        oldest_archived=snapshot.oldest if snapshot else None,
        groups=len(snapshot.groups) if snapshot else 0,
        backlog=sum(queue.ready for queue in service.queues if is_event_queue(queue.name, service.name)),
        workers=len(beats),
        breakers_open=tuple(open_breakers),
        unhealthy=tuple(unhealthy),
        queues=folded(service),
        archive_read_at=snapshot.read_at if snapshot else None,
        history_replay=None if replay is None else replay_position(replay),
        archive_unreadable=unreadable,
    )
    return _with_problems(row)


def _archived_in_the_last_minute(snapshot: Snapshot, now: datetime | None) -> float | None:
    """The messages the archive took in the minute before ``now``, as its entries say (the management API's rate
    is an average over its last few seconds' sample, 0.0 a moment after a burst)."""
    if now is None or snapshot.read_at is None:
        return None
    since = now - timedelta(minutes=1)
    return float(sum(1 for entry in snapshot.entries if entry.archived_at is not None and entry.archived_at >= since))


def replay_position(cursor: Cursor) -> str:
    """How far a history replay into the service got, in words."""
    into = f" into {cursor.handler}" if cursor.handler else ""
    state = "done" if cursor.done else f"stopped or running, next offset {cursor.next}"
    return f"history replay {cursor.replay}{into}: {cursor.replayed:,} replayed, {state}"


def _with_problems(row: ServiceRow) -> ServiceRow:
    problems = []
    if row.failed_per_minute:
        problems.append(f"failing: {row.failed_per_minute:.0f} archived per minute")
    if row.breakers_open:
        problems.append(f"paused: {', '.join(row.breakers_open)}")
    if row.unhealthy:
        problems.append(f"unhealthy: {', '.join(row.unhealthy)}")
    if row.backlog and not any(queue.consumers for queue in row.queues):
        problems.append(f"{row.backlog} event(s) waiting and no consumer")
    if any(queue.replicas_missing for queue in row.queues):
        problems.append("a queue has replicas offline")
    if row.archived:
        problems.append(f"{row.archived} archived in {row.groups} group(s)")
    return ServiceRow(**{**row.__dict__, "problems": tuple(problems)})


def by_urgency(rows: list[ServiceRow]) -> list[ServiceRow]:
    """Services with a problem first (the more problems, the earlier), then by name."""
    return sorted(rows, key=lambda row: (-len(row.problems), row.name))


def folded(service: ServiceQueues) -> tuple[QueueState, ...]:
    """The service's event queues one line each, then each other kind of its queues as one line."""
    lines = [_line(queue.name, [queue]) for queue in service.queues if is_event_queue(queue.name, service.name)]
    for kind, label in FOLDED.items():
        members = [
            queue
            for queue in service.queues
            if queue_kind(queue.name, service.name) == kind and not is_event_queue(queue.name, service.name)
        ]
        if members:
            lines.append(_line(f"{label} ({len(members)} queues)" if len(members) > 1 else members[0].name, members))
    return tuple(lines)


def _line(name: str, queues: list[QueueState]) -> QueueState:
    """``queues`` as one line: their messages and rates added up, the fewest replicas online."""
    replicated = [queue for queue in queues if queue.replicas is not None]
    return QueueState(
        name,
        sum(queue.ready for queue in queues),
        sum(queue.unacked for queue in queues),
        max(queue.consumers for queue in queues),
        _sum(queue.incoming for queue in queues),
        _sum(queue.acked for queue in queues),
        min((queue.replicas or 0 for queue in replicated), default=None),
        min((queue.online or 0 for queue in replicated), default=None),
    )


def _sum(values: Any) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None
