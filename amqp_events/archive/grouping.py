"""Archived messages grouped by cause. Pure: no I/O.

Two archived messages are of one group when they failed in the same handler
with the same exception type, the same message once its particulars are
masked (numbers, ids, quoted values: ``KeyError: 'linus'`` and
``KeyError: 'ada'`` are one cause) and the same stack (the file and function
of each frame, not their line numbers, so that a deploy that moves a line
keeps the group). A message archived without an exception (``malformed``,
``unknown_event``) is grouped by its reason.

A group's id is a hash of that signature: the same for every reader, every
run, so a script may keep it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from amqp_events.wire.archive_entries import ArchivedMessage

#: What marks a masked particular: one mark for every kind (a user id may be a number in one message and a
#: quoted name in the next).
MASK = "<…>"
#: The particulars of a message that differ between failures of one cause, masked in this order.
_PARTICULARS = (
    re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""),
    re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE),
    re.compile(r"\b0x[0-9a-f]+\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{6,}\b", re.IGNORECASE),
    re.compile(r"[-+]?\d+(?:\.\d+)?"),
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+, in (?P<function>.+)$', re.MULTILINE)
#: A frame of the library's, of Celery's or of kombu's code rather than the service's.
_LIBRARY_FRAME = re.compile(r"[/\\](amqp_events|celery|kombu|billiard|vine)[/\\]")
#: The innermost frames a signature keeps (deeper ones are the worker's own, the same for every failure).
FRAMES = 8
#: The longest masked message kept (a message is shown in full on its own page).
MESSAGE_LENGTH = 300


def masked(message: str) -> str:
    """``message`` with what varies between failures of one cause replaced: quoted values, uuids, hex ids and
    numbers."""
    for pattern in _PARTICULARS:
        message = pattern.sub(MASK, message)
    return " ".join(message.split())[:MESSAGE_LENGTH]


def frames(traceback: str) -> tuple[str, ...]:
    """The innermost frames of a traceback, each as ``file:function`` (line numbers left out)."""
    found = [f"{match['file']}:{match['function'].strip()}" for match in _FRAME.finditer(traceback)]
    return tuple(found[-FRAMES:])


@dataclass(frozen=True)
class Cause:
    """What the messages of one group have in common."""

    handler: str
    exception: str
    message: str
    stack: tuple[str, ...]

    @property
    def id(self) -> str:
        text = json.dumps([self.handler, self.exception, self.message, self.stack])
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    @property
    def origin(self) -> str:
        """The innermost frame of the service's own code (``file:function``), "" when the failure came from none
        (a payload the handler cannot take is refused before it runs): where an operator looks first."""
        return next((frame for frame in reversed(self.stack) if not _LIBRARY_FRAME.search(frame)), "")

    @property
    def title(self) -> str:
        """One line for an operator: ``KeyError: '…'``."""
        return f"{self.exception}: {self.message}" if self.message else self.exception


def cause_of(archived: ArchivedMessage) -> Cause:
    """The cause ``archived`` failed of (its reason standing for the exception when it has none)."""
    exception = archived.exception_type or f"({archived.reason})"
    return Cause(archived.handler, exception, masked(archived.exception_message), frames(archived.traceback))


def group_of(archived: ArchivedMessage) -> str:
    """The id of ``archived``'s group."""
    return cause_of(archived).id


@dataclass(frozen=True)
class Group:
    """The archived messages of one cause: how many, the first and last archived, of which events."""

    cause: Cause
    count: int
    first_seen: datetime | None
    last_seen: datetime | None
    events: tuple[str, ...]
    reasons: tuple[str, ...]

    @property
    def id(self) -> str:
        return self.cause.id

    def summary(self) -> dict[str, object]:
        """The group as the API answers it."""
        return {
            "id": self.id,
            "handler": self.cause.handler,
            "exception": self.cause.exception,
            "message": self.cause.message,
            "title": self.cause.title,
            "stack": list(self.cause.stack),
            "origin": self.cause.origin,
            "count": self.count,
            "first_seen": self.first_seen.isoformat() if self.first_seen else None,
            "last_seen": self.last_seen.isoformat() if self.last_seen else None,
            "events": list(self.events),
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class Failure:
    """What grouping needs of one archived message (the console keeps these, not the messages)."""

    cause: Cause
    event: str
    reason: str
    archived_at: datetime | None

    @classmethod
    def of(cls, archived: ArchivedMessage) -> Failure:
        return cls(cause_of(archived), archived.event, archived.reason, archived.archived_at)


def grouped(failures: Iterable[Failure]) -> list[Group]:
    """The groups of ``failures``, the largest first (then the most recent), counted as they pass (nothing of
    them kept: an archive of any size is grouped in the memory of its groups)."""
    tallies: dict[Cause, _Tally] = {}
    for failure in failures:
        tally = tallies.get(failure.cause)
        if tally is None:
            tally = tallies[failure.cause] = _Tally()
        tally.add(failure)
    groups = [tally.group(cause) for cause, tally in tallies.items()]
    return sorted(groups, key=lambda group: (-group.count, -(group.last_seen.timestamp() if group.last_seen else 0)))


class _Tally:
    def __init__(self) -> None:
        self.count = 0
        self.first: datetime | None = None
        self.last: datetime | None = None
        self.events: set[str] = set()
        self.reasons: set[str] = set()

    def add(self, failure: Failure) -> None:
        self.count += 1
        self.events.add(failure.event)
        self.reasons.add(failure.reason)
        moment = failure.archived_at
        if moment is not None:
            self.first = moment if self.first is None else min(self.first, moment)
            self.last = moment if self.last is None else max(self.last, moment)

    def group(self, cause: Cause) -> Group:
        return Group(cause, self.count, self.first, self.last, tuple(sorted(self.events)), tuple(sorted(self.reasons)))
