"""Reading, replaying and purging a service's archive.

The archive is a bounded quorum queue (``<service>.archive``) holding the
messages that ran out of retries or can never succeed, each with the
``archive_*`` headers of :mod:`amqp_events.message`. This module browses it
without consuming it: messages are fetched unacknowledged and handed back
to the queue when the channel closes, except those an operation is meant to
remove, which are acked one by one, and for a replay only after the broker
confirmed the replayed copy. An interrupted replay therefore loses nothing
(at worst a message is replayed twice).
"""

from __future__ import annotations

import base64
import builtins
import getpass
import json
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from kombu.utils.json import loads as json_loads

from amqp_events import cloud_events, tracing
from amqp_events import message as wire
from amqp_events.logs import log_event
from amqp_events.message import OutgoingMessage, copy_headers, parse_time
from amqp_events.topology import archive_queue_name, event_queue_name

if TYPE_CHECKING:
    from amqp_events.app import EventsApp

JSON_TYPES = ("application/json",)


@dataclass(frozen=True)
class ArchivedMessage:
    """One archived message: why it is there, and the original message itself."""

    id: str
    event: str
    service: str
    handler: str
    reason: str
    exception_type: str
    exception_message: str
    traceback: str
    attempts: int
    #: The handler section it failed in (:mod:`amqp_events.sections`), "" outside any.
    section: str
    first_failure_at: datetime | None
    last_failure_at: datetime | None
    archived_at: datetime | None
    #: The queue it came from, where a replay sends it back.
    queue: str
    exchange: str
    routing_key: str
    headers: dict[str, Any] = field(repr=False)
    body: bytes = field(repr=False)
    content_type: str | None = None
    content_encoding: str | None = None
    #: Its CloudEvents attributes, if it arrived as a CloudEvent (:mod:`amqp_events.cloud_events`).
    cloud_event: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_parts(
        cls, headers: dict[str, Any], body: bytes, content_type: str | None, content_encoding: str | None
    ) -> ArchivedMessage:
        service = str(headers.get(wire.ARCHIVE_SERVICE) or "")
        cloud_event = cloud_events.attributes_of(headers, body, content_type)
        event = str(headers.get("task") or cloud_event.get("type") or "")
        return cls(
            id=str(headers.get("id") or cloud_event.get("id") or ""),
            event=event,
            service=service,
            handler=str(headers.get(wire.ARCHIVE_HANDLER) or ""),
            reason=str(headers.get(wire.ARCHIVE_REASON) or "unknown"),
            exception_type=str(headers.get(wire.ARCHIVE_EXCEPTION_TYPE) or ""),
            exception_message=str(headers.get(wire.ARCHIVE_EXCEPTION_MESSAGE) or ""),
            traceback=str(headers.get(wire.ARCHIVE_TRACEBACK) or ""),
            attempts=int(headers.get(wire.ARCHIVE_ATTEMPTS) or 0),
            section=str(headers.get(wire.ARCHIVE_SECTION) or ""),
            first_failure_at=parse_time(headers.get(wire.ARCHIVE_FIRST_FAILURE_AT)),
            last_failure_at=parse_time(headers.get(wire.ARCHIVE_LAST_FAILURE_AT)),
            archived_at=parse_time(headers.get(wire.ARCHIVED_AT)),
            queue=str(headers.get(wire.ARCHIVE_QUEUE) or _default_queue(service, event)),
            exchange=str(headers.get(wire.ARCHIVE_EXCHANGE) or ""),
            routing_key=str(headers.get(wire.ARCHIVE_ROUTING_KEY) or ""),
            headers=headers,
            body=body,
            content_type=content_type,
            content_encoding=content_encoding,
            cloud_event=cloud_event,
        )

    @property
    def payload(self) -> Any:
        """The decoded body when it is JSON (never anything else: pickle is not read), else ``None``."""
        if self.content_type not in JSON_TYPES:
            return None
        try:
            return json_loads(self.body.decode(self.content_encoding or "utf-8"))
        except (ValueError, LookupError, RecursionError):  # not JSON, unknown encoding, absurdly nested
            return None

    def summary(self) -> dict[str, Any]:
        """The fields ``archive list --json`` prints."""
        return {
            "id": self.id,
            "event": self.event,
            "service": self.service,
            "handler": self.handler,
            "reason": self.reason,
            "exception_type": self.exception_type,
            "exception_message": self.exception_message,
            "attempts": self.attempts,
            "section": self.section,
            "first_failure_at": _iso(self.first_failure_at),
            "archived_at": _iso(self.archived_at),
            "queue": self.queue,
            "cloudevent": self.cloud_event or None,
        }

    def to_json(self) -> dict[str, Any]:
        """Everything, JSON-safe: what ``archive export`` writes and ``archive import`` reads back."""
        try:
            body, encoding = self.body.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            body, encoding = base64.b64encode(self.body).decode("ascii"), "base64"
        return {
            **self.summary(),
            "traceback": self.traceback,
            "last_failure_at": _iso(self.last_failure_at),
            "exchange": self.exchange,
            "routing_key": self.routing_key,
            "content_type": self.content_type,
            "content_encoding": self.content_encoding,
            "headers": _json_safe(self.headers),
            "body": body,
            "body_encoding": encoding,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArchivedMessage:
        raw = data["body"]
        body = base64.b64decode(raw) if data.get("body_encoding") == "base64" else raw.encode("utf-8")
        return cls.from_parts(dict(data["headers"]), body, data.get("content_type"), data.get("content_encoding"))


@dataclass(frozen=True)
class Selection:
    """Which archived messages an operation touches (every given criterion must match)."""

    ids: frozenset[str] = frozenset()
    event: str | None = None
    reason: str | None = None
    limit: int | None = None

    @classmethod
    def of(
        cls,
        ids: Iterable[str] = (),
        event: str | None = None,
        reason: str | None = None,
        limit: int | None = None,
    ) -> Selection:
        return cls(frozenset(ids), event, reason, limit)

    @classmethod
    def exactly(cls, entries: Iterable[ArchivedMessage]) -> Selection:
        """These messages and no other: what an operator was shown and confirmed."""
        ids = [entry.id for entry in entries]
        return cls(frozenset(ids), limit=len(ids))

    def matches(self, archived: ArchivedMessage) -> bool:
        return (
            (not self.ids or archived.id in self.ids)
            and (self.event is None or archived.event == self.event)
            and (self.reason is None or archived.reason == self.reason)
        )


EVERYTHING = Selection()


@dataclass
class ReplayReport:
    #: Ids sent back to their queue (and removed from the archive).
    replayed: list[str] = field(default_factory=list)
    #: Ids whose original queue no longer exists: left in the archive.
    unroutable: list[str] = field(default_factory=list)


class Archive:
    """The archive of ``app``'s service (or of ``service``, for operators looking at another one)."""

    def __init__(self, app: EventsApp, service: str | None = None) -> None:
        self.app = app
        self.service = service or app.service
        self.queue = archive_queue_name(self.service)

    def count(self) -> int:
        """Messages in the archive right now (without touching them)."""
        return self.app.transport.count(self.queue)

    def list(self, selection: Selection = EVERYTHING) -> list[ArchivedMessage]:
        """The archived messages that match, oldest first. Nothing is consumed."""
        with self._browse() as messages:
            return [archived for archived, _ in _take(messages, selection)]

    def get(self, message_id: str) -> ArchivedMessage | None:
        found = self.list(Selection.of(ids=[message_id], limit=1))
        return found[0] if found else None

    def replay(
        self,
        selection: Selection = EVERYTHING,
        on_replayed: Callable[[ArchivedMessage], None] | None = None,
        new_ids: bool = False,
        replayed_by: str = "",
    ) -> ReplayReport:
        """Send matching messages back to the queue they came from, with their retry count reset.

        Each archived copy is removed only after the broker confirmed its
        replacement; ``on_replayed`` is called in between, once per message
        (a progress hook: if the process dies there, the message is in both
        places, a duplicate rather than a loss). With ``new_ids`` each copy
        gets a new event id (``replay_of`` keeps the old one), so that a
        handler with an inbox runs it even if it handled the event before.
        ``replayed_by`` (who, e.g. ``user@host``) is logged and, with tracing
        on, recorded on each replay's span.
        """
        report = ReplayReport()
        by = replayed_by or f"{getpass.getuser()}@{socket.gethostname()}"
        with self._browse() as messages:
            for archived, remove in _take(messages, selection):
                message = replay_message(archived, new_id=new_ids)
                with tracing.replaying(self.service, archived, message, by):
                    routed = self.app.transport.publish(message)
                if not routed:
                    report.unroutable.append(archived.id)
                    continue
                if on_replayed:
                    on_replayed(archived)
                remove()
                report.replayed.append(archived.id)
                log_event(
                    "replayed",
                    event=archived.event,
                    service=self.service,
                    event_id=archived.id,
                    queue=archived.queue,
                    replayed_by=by,
                )
        return report

    def purge(self, selection: Selection = EVERYTHING) -> builtins.list[str]:
        """Delete matching messages for good; returns their ids."""
        purged = []
        with self._browse() as messages:
            for archived, remove in _take(messages, selection):
                remove()
                purged.append(archived.id)
        return purged

    def export(self, out: IO[str], selection: Selection = EVERYTHING) -> int:
        """Write matching messages as JSON lines (nothing is removed); returns how many."""
        archived = self.list(selection)
        for entry in archived:
            out.write(json.dumps(entry.to_json()) + "\n")
        return len(archived)

    def load(self, lines: Iterable[str]) -> int:
        """Put exported messages (JSON lines) back into this archive; returns how many."""
        loaded = 0
        for line in lines:
            if line.strip():
                archived = ArchivedMessage.from_json(json.loads(line))
                self.app.publish_routed(
                    OutgoingMessage(
                        exchange="",
                        routing_key=self.queue,
                        headers=archived.headers,
                        body=archived.body,
                        message_id=archived.id,
                        content_type=archived.content_type or "application/octet-stream",
                        content_encoding=archived.content_encoding or "binary",
                    )
                )
                loaded += 1
        return loaded

    @contextmanager
    def _browse(self) -> Iterator[Iterator[tuple[ArchivedMessage, Callable[[], None]]]]:
        with self.app.transport.browse(self.queue) as stored:
            yield (
                (ArchivedMessage.from_parts(m.headers, m.body, m.content_type, m.content_encoding), remove)
                for m, remove in stored
            )


def replay_message(archived: ArchivedMessage, new_id: bool = False) -> OutgoingMessage:
    """What a replay publishes: the original body and envelope, retry count reset, straight to its queue.

    ``new_id``: under a new event id, the old one in the ``replay_of`` header.
    """
    headers = copy_headers(archived.headers, retries=0)
    if new_id:
        headers.update(id=str(uuid.uuid4()), replay_of=archived.id)
    return OutgoingMessage(
        exchange="",
        routing_key=archived.queue,
        headers=headers,
        body=archived.body,
        message_id=headers["id"],
        content_type=archived.content_type or "application/octet-stream",
        content_encoding=archived.content_encoding or "binary",
    )


def _take(
    messages: Iterator[tuple[ArchivedMessage, Callable[[], None]]], selection: Selection
) -> Iterator[tuple[ArchivedMessage, Callable[[], None]]]:
    # Every message is fetched, also past the limit: the broker puts unacked messages back behind the
    # others, so stopping early would move the ones fetched so far to the end of the archive.
    taken = 0
    for archived, ack in messages:
        if (selection.limit is None or taken < selection.limit) and selection.matches(archived):
            taken += 1
            yield archived, ack


def _default_queue(service: str, event: str) -> str:
    try:
        return event_queue_name(service, event)
    except ValueError:
        return ""


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value
