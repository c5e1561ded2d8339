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
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from kombu.utils.json import loads as json_loads

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

    @classmethod
    def from_parts(
        cls, headers: dict[str, Any], body: bytes, content_type: str | None, content_encoding: str | None
    ) -> ArchivedMessage:
        service = str(headers.get(wire.ARCHIVE_SERVICE) or "")
        event = str(headers.get("task") or "")
        return cls(
            id=str(headers.get("id") or ""),
            event=event,
            service=service,
            handler=str(headers.get(wire.ARCHIVE_HANDLER) or ""),
            reason=str(headers.get(wire.ARCHIVE_REASON) or "unknown"),
            exception_type=str(headers.get(wire.ARCHIVE_EXCEPTION_TYPE) or ""),
            exception_message=str(headers.get(wire.ARCHIVE_EXCEPTION_MESSAGE) or ""),
            traceback=str(headers.get(wire.ARCHIVE_TRACEBACK) or ""),
            attempts=int(headers.get(wire.ARCHIVE_ATTEMPTS) or 0),
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
            "first_failure_at": _iso(self.first_failure_at),
            "archived_at": _iso(self.archived_at),
            "queue": self.queue,
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

    def matches(self, archived: ArchivedMessage) -> bool:
        return (
            (not self.ids or archived.id in self.ids)
            and (self.event is None or archived.event == self.event)
            and (self.reason is None or archived.reason == self.reason)
        )


EVERYTHING = Selection()


@dataclass
class ReplayReport:
    replayed: int = 0
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
        with self.app.connection_for_write() as connection:
            channel: Any = connection.default_channel
            return int(channel.queue_declare(self.queue, passive=True).message_count)

    def list(self, selection: Selection = EVERYTHING) -> list[ArchivedMessage]:
        """The archived messages that match, oldest first. Nothing is consumed."""
        with self._browse() as messages:
            return [archived for archived, _ in _take(messages, selection)]

    def get(self, message_id: str) -> ArchivedMessage | None:
        found = self.list(Selection.of(ids=[message_id], limit=1))
        return found[0] if found else None

    def replay(
        self, selection: Selection = EVERYTHING, on_replayed: Callable[[ArchivedMessage], None] | None = None
    ) -> ReplayReport:
        """Send matching messages back to the queue they came from, with their retry count reset.

        Each archived copy is acked only after the broker confirmed its replacement.
        """
        report = ReplayReport()
        with self._browse() as messages:
            for archived, ack in _take(messages, selection):
                if self.app.publisher.publish(replay_message(archived)):
                    ack()
                    report.replayed += 1
                    log_event(
                        "replayed",
                        event=archived.event,
                        service=self.service,
                        event_id=archived.id,
                        queue=archived.queue,
                    )
                    if on_replayed:
                        on_replayed(archived)
                else:
                    report.unroutable.append(archived.id)
        return report

    def purge(self, selection: Selection = EVERYTHING) -> int:
        """Delete matching messages for good; returns how many."""
        purged = 0
        with self._browse() as messages:
            for _, ack in _take(messages, selection):
                ack()
                purged += 1
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
        """Fetch every message unacked; whatever is not acked goes back when the channel closes."""
        with self.app.connection_for_write() as connection:
            channel: Any = connection.channel()
            channel.queue_declare(self.queue, passive=True)  # a clear 404 when it does not exist
            try:
                yield _fetch_all(channel, self.queue)
            finally:
                channel.close()


def replay_message(archived: ArchivedMessage) -> OutgoingMessage:
    """What a replay publishes: the original body and envelope, retry count reset, straight to its queue."""
    return OutgoingMessage(
        exchange="",
        routing_key=archived.queue,
        headers=copy_headers(archived.headers, retries=0),
        body=archived.body,
        message_id=archived.id,
        content_type=archived.content_type or "application/octet-stream",
        content_encoding=archived.content_encoding or "binary",
    )


def _fetch_all(channel: Any, queue: str) -> Iterator[tuple[ArchivedMessage, Callable[[], None]]]:
    while True:
        fetched = channel.basic_get(queue, no_ack=False)
        if fetched is None:
            return
        body = fetched.body if isinstance(fetched.body, bytes) else str(fetched.body).encode("utf-8")
        archived = ArchivedMessage.from_parts(
            dict(fetched.headers or {}), body, fetched.content_type, fetched.content_encoding
        )
        yield archived, _acker(channel, fetched.delivery_tag)


def _acker(channel: Any, delivery_tag: int) -> Callable[[], None]:
    return lambda: channel.basic_ack(delivery_tag)


def _take(
    messages: Iterator[tuple[ArchivedMessage, Callable[[], None]]], selection: Selection
) -> Iterator[tuple[ArchivedMessage, Callable[[], None]]]:
    taken = 0
    for archived, ack in messages:
        if selection.limit is not None and taken >= selection.limit:
            return
        if selection.matches(archived):
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
