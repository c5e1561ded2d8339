"""What the console knows of each archive without reading it again: an index, read by a browse when the archive
changed, from which every page answers.

A browse takes each archived message unacked until it ends, so the console
browses an archive only when its *stamp* changed (its exact size, and the
broker's counts of messages published into it and acked out of it) or its
last reading is older than :data:`MAX_AGE`; a message read before is not
decoded again. Memory is bounded: the newest ``keep`` messages of an archive
are kept as short :class:`Entry` values (arguments and messages cut short),
and its groups are counted over every message.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from amqp_events.archive.grouping import Cause, Failure, Group, cause_of, grouped
from amqp_events.topology import archive_queue_name
from amqp_events.transport.base import Transport
from amqp_events.wire.archive_entries import ArchivedMessage
from amqp_events.wire.trust import Identity

#: Seconds after which an archive is read again even if its stamp did not change (another tool's purge and
#: archive of one message each, with the broker's statistics off, leave the stamp as it was).
MAX_AGE = 300.0
#: The longest arguments (as JSON) and exception message an entry keeps.
SHORT = 300
#: The longest traceback kept of each group.
TRACEBACK = 8000
#: What tells an archive changed: its exact size, and the broker's counts of messages published into it and acked
#: out of it (``None`` until the broker reports them).
Stamp = tuple[int, int | None, int | None]


@dataclass(frozen=True, slots=True)
class Entry:
    """One archived message as the console lists it."""

    id: str
    event: str
    handler: str
    reason: str
    exception_type: str
    exception_message: str
    cause: Cause
    attempts: int
    first_failure_at: datetime | None
    archived_at: datetime | None
    #: Its arguments as JSON, cut to :data:`SHORT` characters (``None``: its body is not an event's).
    arguments: str | None

    @classmethod
    def of(cls, archived: ArchivedMessage, causes: dict[Cause, Cause]) -> Entry:
        cause = cause_of(archived)
        arguments = archived.named_arguments
        return cls(
            archived.id,
            archived.event,
            archived.handler,
            archived.reason,
            archived.exception_type,
            archived.exception_message[:SHORT],
            causes.setdefault(cause, cause),  # one object per cause, however many messages share it
            archived.attempts,
            archived.first_failure_at,
            archived.archived_at,
            None if arguments is None else _short(json.dumps(arguments, default=str)),
        )

    @property
    def failure(self) -> Failure:
        return Failure(self.cause, self.event, self.reason, self.archived_at)

    def summary(self) -> dict[str, object]:
        return {
            "id": self.id,
            "event": self.event,
            "handler": self.handler,
            "reason": self.reason,
            "exception_type": self.exception_type,
            "exception_message": self.exception_message,
            "group": self.cause.id,
            "attempts": self.attempts,
            "first_failure_at": self.first_failure_at.isoformat() if self.first_failure_at else None,
            "archived_at": self.archived_at.isoformat() if self.archived_at else None,
            "arguments": self.arguments,
        }


@dataclass(frozen=True)
class Snapshot:
    """An archive as last read: its newest entries (oldest first), its size and groups, and when it was read."""

    service: str
    count: int
    entries: tuple[Entry, ...] = ()
    groups: tuple[Group, ...] = ()
    #: How many of each reason it holds, by reason.
    reasons: tuple[tuple[str, int], ...] = ()
    #: A traceback of each group (one of its members'), by group id.
    tracebacks: Mapping[str, str] = field(default_factory=dict)
    read_at: datetime | None = None
    #: Seconds the reading took.
    took: float = 0.0
    stamp: Stamp | None = None
    _read_monotonic: float = field(default=0.0, repr=False)

    @property
    def oldest(self) -> datetime | None:
        return min((group.first_seen for group in self.groups if group.first_seen), default=None)

    def group(self, group_id: str) -> Group | None:
        return next((group for group in self.groups if group.id == group_id), None)

    def members(self, group_id: str) -> list[Entry]:
        return [entry for entry in self.entries if entry.cause.id == group_id]


class ArchiveIndex:
    """The snapshots of the archives read through ``transport``, each keeping at most ``keep`` entries."""

    def __init__(self, transport: Transport, keep: int = 20_000, identity: Identity | None = None) -> None:
        self.transport, self.keep, self.identity = transport, keep, identity
        self._snapshots: dict[str, Snapshot] = {}
        self._reading = threading.Lock()  # one browse at a time: a refresh and an operator's change

    def snapshot(self, service: str) -> Snapshot | None:
        return self._snapshots.get(service)

    def refresh(self, service: str, stamp: Stamp | None = None) -> Snapshot:
        """``service``'s snapshot, read again if ``stamp`` differs from the last reading's (or it is too old, or
        ``stamp`` is ``None``: an operator just changed it)."""
        known = self._snapshots.get(service)
        if known is not None and _unchanged(known.stamp, stamp) and not _too_old(known):
            return known
        with self._reading:
            snapshot = self._read(service, stamp, known)
        self._snapshots[service] = snapshot
        return snapshot

    def forget(self, services: set[str]) -> None:
        """Drop the snapshots of services that are gone."""
        for service in set(self._snapshots) - services:
            del self._snapshots[service]

    def _read(self, service: str, stamp: Stamp | None, known: Snapshot | None) -> Snapshot:
        started, read_at = time.monotonic(), datetime.now(timezone.utc)
        before = {entry.id: entry for entry in known.entries} if known else {}
        causes = {entry.cause: entry.cause for entry in before.values()}
        tracebacks = dict(known.tracebacks) if known else {}
        entries: list[Entry] = []
        with self.transport.browse(archive_queue_name(service)) as stored:
            for message, _ in stored:
                message_id = str(message.headers.get("id") or "")
                entry = before.get(message_id) if message_id else None
                if entry is None:
                    archived = ArchivedMessage.of(message, self.identity)
                    entry = Entry.of(archived, causes)
                    tracebacks.setdefault(entry.cause.id, archived.traceback[:TRACEBACK])
                entries.append(entry)
        entries.sort(key=_archived_at)
        groups = grouped(entry.failure for entry in entries)
        if stamp is not None and stamp[0] != len(entries):
            # Counted one size, read another (a failure archived or a message removed meanwhile, another reader
            # holding some): kept under this stamp, this reading would stand until it is too old. Read again.
            stamp = None
        return Snapshot(
            service,
            len(entries),
            tuple(entries[-self.keep :]),
            tuple(groups),
            tuple(sorted(Counter(entry.reason for entry in entries).items())),
            {group.id: tracebacks[group.id] for group in groups if group.id in tracebacks},
            read_at,
            time.monotonic() - started,
            stamp,
            time.monotonic(),
        )


def _unchanged(before: Stamp | None, now: Stamp | None) -> bool:
    """The same size and, where the broker's counts are known in both, the same counts (counts appear a few
    seconds after an archive is declared: that alone is no change worth a browse)."""
    if before is None or now is None:
        return False
    return before[0] == now[0] and all(
        old is None or new is None or old == new for old, new in zip(before, now, strict=True)
    )


def _too_old(snapshot: Snapshot) -> bool:
    return time.monotonic() - snapshot._read_monotonic > MAX_AGE


def _archived_at(entry: Entry) -> float:
    return entry.archived_at.timestamp() if entry.archived_at else float("inf")


def _short(text: str) -> str:
    return text if len(text) <= SHORT else text[: SHORT - 1] + "…"
