"""Archived copies: what the archive keeps of a message that ran out of retries or can never succeed.

An archived copy is the original message, body and content type byte for
byte, with the ``archive_*`` headers of :mod:`amqp_events.wire.message`
added (:func:`archived_message`); :class:`ArchivedMessage` reads one back.
Pure: no I/O.
"""

from __future__ import annotations

import base64
import traceback as tb
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kombu.utils.json import loads as json_loads

from amqp_events.clock import SYSTEM_CLOCK
from amqp_events.topology.names import archive_queue_name, event_of, event_queue_name, owner_of, to_queue
from amqp_events.wire import cloud_events
from amqp_events.wire.message import (
    ARCHIVE_ATTEMPTS,
    ARCHIVE_CUT,
    ARCHIVE_EXCEPTION_MESSAGE,
    ARCHIVE_EXCEPTION_TYPE,
    ARCHIVE_EXCHANGE,
    ARCHIVE_FIRST_FAILURE_AT,
    ARCHIVE_HANDLER,
    ARCHIVE_HEADERS,
    ARCHIVE_LAST_FAILURE_AT,
    ARCHIVE_QUEUE,
    ARCHIVE_REASON,
    ARCHIVE_ROUTING_KEY,
    ARCHIVE_SECTION,
    ARCHIVE_SERVICE,
    ARCHIVE_TRACEBACK,
    ARCHIVED_AT,
    OutgoingMessage,
    Reason,
    StoredMessage,
    event_id,
    is_task_body,
    isoformat,
    parse_time,
)
from amqp_events.wire.parked import PARKS_KEY

MAX_EXCEPTION_MESSAGE = 1000
MAX_TRACEBACK = 4096
JSON_TYPES = ("application/json",)


@dataclass(frozen=True)
class Failure:
    """Why a message is being archived, and what the handler raised (if it ran)."""

    reason: str
    exception_type: str = ""
    exception_message: str = ""
    traceback: str = ""
    attempts: int = 0
    first_failure_at: datetime | None = None
    last_failure_at: datetime = field(default_factory=SYSTEM_CLOCK.now)
    #: The handler section it failed in ("" outside any section).
    section: str = ""
    #: What of the message could not be kept as it came (:mod:`amqp_events.wire.limits`), "" when nothing.
    cut: str = ""

    @classmethod
    def from_exception(
        cls,
        reason: str,
        exc: BaseException,
        attempts: int = 0,
        first_failure_at: datetime | None = None,
        now: datetime | None = None,
        section: str = "",
        cut: str = "",
    ) -> Failure:
        """``exc``, as the archive records it, at ``now``."""
        return cls(
            reason=reason,
            exception_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
            exception_message=_shorten(str(exc), MAX_EXCEPTION_MESSAGE),
            traceback=_tail("".join(tb.format_exception(type(exc), exc, exc.__traceback__)), MAX_TRACEBACK),
            attempts=attempts,
            first_failure_at=first_failure_at,
            last_failure_at=now or SYSTEM_CLOCK.now(),
            section=section,
            cut=cut,
        )


@dataclass(frozen=True)
class Delivered(StoredMessage):
    """A message as the worker received it, with where it came from: what an archived copy must keep."""

    exchange: str = ""
    routing_key: str = ""
    queue: str = ""


def archived_message(delivered: Delivered, failure: Failure, service: str, handler: str) -> OutgoingMessage:
    """The copy of ``delivered`` that goes into ``service``'s archive queue.

    The body and content type are kept byte for byte; the original headers
    are kept (stripped of earlier ``archive_*`` headers) and the archive
    headers added. It is archived when it failed for the last time.
    """
    now = failure.last_failure_at
    headers = {key: value for key, value in delivered.headers.items() if key not in ARCHIVE_HEADERS}
    headers.update(
        {
            ARCHIVE_REASON: failure.reason,
            ARCHIVE_SERVICE: service,
            ARCHIVE_HANDLER: handler,
            ARCHIVE_QUEUE: delivered.queue,
            ARCHIVE_EXCHANGE: delivered.exchange,
            ARCHIVE_ROUTING_KEY: delivered.routing_key,
            ARCHIVE_EXCEPTION_TYPE: failure.exception_type,
            ARCHIVE_EXCEPTION_MESSAGE: failure.exception_message,
            ARCHIVE_TRACEBACK: failure.traceback,
            ARCHIVE_ATTEMPTS: failure.attempts,
            ARCHIVE_SECTION: failure.section,
            ARCHIVE_FIRST_FAILURE_AT: isoformat(failure.first_failure_at or failure.last_failure_at),
            ARCHIVE_LAST_FAILURE_AT: isoformat(failure.last_failure_at),
            ARCHIVED_AT: isoformat(now),
        }
    )
    if failure.cut:
        headers[ARCHIVE_CUT] = failure.cut
    return OutgoingMessage(
        *to_queue(archive_queue_name(service)),
        headers=headers,
        body=delivered.body,
        message_id=event_id(delivered.headers) or str(uuid.uuid4()),
        content_type=delivered.content_type or "application/octet-stream",
        content_encoding=delivered.content_encoding or "binary",
    )


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tail(text: str, limit: int) -> str:
    """The end of a traceback is where the error is: keep that part."""
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


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
    #: The handler section it failed in (:mod:`amqp_events.core.sections`), "" outside any.
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
    #: Its CloudEvents attributes, if it arrived as a CloudEvent (:mod:`amqp_events.wire.cloud_events`).
    cloud_event: dict[str, str] = field(default_factory=dict)
    #: The RabbitMQ user that published this copy (the service's own, unless the broker itself archived it).
    user_id: str | None = None

    @classmethod
    def of(cls, stored: StoredMessage) -> ArchivedMessage:
        """An archived message as it sits in its archive queue."""
        headers, body, content_type = dict(stored.headers), stored.body, stored.content_type
        read = {**_dead_lettered(headers), **headers}
        service = str(read.get(ARCHIVE_SERVICE) or "")
        cloud_event = cloud_events.attributes_of(headers, body, content_type)
        event = event_of(str(headers.get("task") or cloud_event.get("type") or ""))  # a named handler's task: its event
        return cls(
            id=str(headers.get("id") or cloud_event.get("id") or ""),
            event=event,
            service=service,
            handler=str(read.get(ARCHIVE_HANDLER) or ""),
            reason=str(read.get(ARCHIVE_REASON) or "unknown"),
            exception_type=str(read.get(ARCHIVE_EXCEPTION_TYPE) or ""),
            exception_message=str(read.get(ARCHIVE_EXCEPTION_MESSAGE) or ""),
            traceback=str(read.get(ARCHIVE_TRACEBACK) or ""),
            attempts=_count(read.get(ARCHIVE_ATTEMPTS)),
            section=str(read.get(ARCHIVE_SECTION) or ""),
            first_failure_at=parse_time(read.get(ARCHIVE_FIRST_FAILURE_AT)),
            last_failure_at=parse_time(read.get(ARCHIVE_LAST_FAILURE_AT)),
            archived_at=parse_time(read.get(ARCHIVED_AT)),
            queue=str(read.get(ARCHIVE_QUEUE) or _default_queue(service, event)),
            exchange=str(read.get(ARCHIVE_EXCHANGE) or ""),
            routing_key=str(read.get(ARCHIVE_ROUTING_KEY) or ""),
            headers=headers,
            body=body,
            content_type=content_type,
            content_encoding=stored.content_encoding,
            cloud_event=cloud_event,
            user_id=stored.user_id,
        )

    @property
    def cut(self) -> str:
        """What of the message could not be kept as it came (headers dropped, a body cut), in words ("": none)."""
        return str(self.headers.get(ARCHIVE_CUT) or "")

    @property
    def body_cut(self) -> bool:
        """Was its body cut (so that it cannot run again)?"""
        return "body cut" in self.cut

    @property
    def payload(self) -> Any:
        """The decoded body when it is JSON (never anything else: pickle is not read), else ``None``."""
        if self.content_type not in JSON_TYPES:
            return None
        try:
            return json_loads(self.body.decode(self.content_encoding or "utf-8"))
        except (ValueError, LookupError, RecursionError):  # not JSON, unknown encoding, absurdly nested
            return None

    @property
    def arguments(self) -> tuple[list[Any], dict[str, Any]] | None:
        """The event's positional and named arguments, when its body is an event's (``None`` otherwise)."""
        payload = self.payload
        return (list(payload[0]), dict(payload[1])) if is_task_body(payload) else None

    @property
    def named_arguments(self) -> dict[str, Any] | None:
        """The arguments by name, positional ones as ``[0]``, ``[1]``... (``None`` when the body is not an
        event's): what ``archive show`` and the console show."""
        arguments = self.arguments
        if arguments is None:
            return None
        positional, named = arguments
        return {**{f"[{index}]": value for index, value in enumerate(positional)}, **named}

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
            "parks_key": self.headers.get(PARKS_KEY),
            "cut": self.cut or None,
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
            "user_id": self.user_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArchivedMessage:
        raw = data["body"]
        body = base64.b64decode(raw) if data.get("body_encoding") == "base64" else raw.encode("utf-8")
        return cls.of(
            StoredMessage(
                dict(data["headers"]), body, data.get("content_type"), data.get("content_encoding"), data.get("user_id")
            )
        )


def _dead_lettered(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The archive headers of a message the broker itself put in the archive: one whose AMQP ``expiration``
    passed in its queue (:func:`amqp_events.topology.layout.dead_letter_routes`); none for any other."""
    queue, deaths = headers.get("x-first-death-queue"), headers.get("x-death")
    if headers.get(ARCHIVE_REASON) or headers.get("x-first-death-reason") != "expired" or not isinstance(queue, str):
        return {}
    death = deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], Mapping) else {}
    return {
        ARCHIVE_REASON: Reason.EXPIRED.value,
        ARCHIVE_SERVICE: owner_of(queue) or "",
        ARCHIVE_QUEUE: queue,
        ARCHIVE_EXCEPTION_MESSAGE: "its AMQP expiration passed while it waited in its queue",
        ARCHIVED_AT: death.get("time"),
    }


def _count(value: Any) -> int:
    """A count from a header, 0 when it is anything else (an archive may hold what any producer put there)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


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
