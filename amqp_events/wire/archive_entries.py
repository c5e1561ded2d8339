"""Reading an archive's entries: what is believed of each (:class:`ArchivedMessage`).

An entry a worker of the service wrote (:mod:`amqp_events.wire.archived`) is believed: the service's direct
exchange, by which it came in, takes no one else's messages. An entry the broker dead-lettered there (its AMQP
``expiration`` passed in its queue) came in as its sender wrote it, through the service's dead-letter exchange:
of it only what the broker verified is read. Pure: no I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kombu.utils.json import loads as json_loads

from amqp_events.topology.names import dead_lettering_service, event_of, event_queue_name, owner_of, task_of_queue
from amqp_events.wire import cloud_events
from amqp_events.wire.archive_headers import (
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
    ARCHIVE_TASK,
    ARCHIVE_TRACEBACK,
    ARCHIVED_AT,
)
from amqp_events.wire.message import (
    DEATH_HEADERS,
    FIRED_BY,
    X_DEATH,
    X_DELIVERY_COUNT,
    Reason,
    StoredMessage,
    is_task_body,
    isoformat,
    parse_time,
)
from amqp_events.wire.parked import PARKS_KEY
from amqp_events.wire.trust import Identity

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
    #: The service that fired it, as its receiver verified it ("" when nothing was verified).
    fired_by: str = ""
    #: The handler task chosen for it (by the worker that archived it, or by the queue it expired in): what a
    #: replay routes by ("" when none was chosen: its event is then judged again on its way in).
    task: str = ""
    #: Was it put in the archive by the broker's dead-lettering, as its sender wrote it (its AMQP expiration
    #: passed in its queue)? Then only what the broker verified is read of it.
    dead_lettered: bool = False

    @classmethod
    def of(cls, stored: StoredMessage, identity: Identity | None = None) -> ArchivedMessage:
        """An archived message as it sits in its archive queue. What its ``archive_*`` headers say is believed
        when a worker of the service wrote it; one the broker dead-lettered there is read by what the broker
        verified alone: the queue it expired in (its dead-letter routing key), RabbitMQ's latest death, and its
        author (``identity`` maps its ``user_id`` to a service; without one, none is verified)."""
        headers, body, content_type = dict(stored.headers), stored.body, stored.content_type
        dead_lettered = dead_lettering_service(stored.exchange) is not None
        read = _dead_lettered(stored) if dead_lettered else headers
        service = str(read.get(ARCHIVE_SERVICE) or "")
        cloud_event = cloud_events.attributes_of(headers, body, content_type)
        event = event_of(str(headers.get("task") or cloud_event.get("type") or ""))  # a named handler's task: its event
        task = str(read.get(ARCHIVE_TASK) or "")
        if task:  # the handler a worker chose, or its queue's own (per_handler): its event is the fact
            event = event_of(task)
        if dead_lettered:
            author = (identity.author(stored.user_id, None) if identity is not None else None) or ""
        else:
            author = str(headers.get(FIRED_BY) or "")
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
            queue=str(read.get(ARCHIVE_QUEUE) or ("" if dead_lettered else _default_queue(service, event))),
            exchange=str(read.get(ARCHIVE_EXCHANGE) or ""),
            routing_key=str(read.get(ARCHIVE_ROUTING_KEY) or ""),
            headers=headers,
            body=body,
            content_type=content_type,
            content_encoding=stored.content_encoding,
            cloud_event=cloud_event,
            user_id=stored.user_id,
            fired_by=author,
            task=task,
            dead_lettered=dead_lettered,
        )

    def recorded_headers(self) -> dict[str, Any]:
        """Its headers as the archive records them: the message's own, without what the broker wrote on
        dead-lettering, and the ``archive_*`` headers of what is believed (:meth:`of`): what an export keeps, so
        that an import believes no more than this reading did."""
        headers = {
            key: value
            for key, value in self.headers.items()
            if key not in ARCHIVE_HEADERS and key not in DEATH_HEADERS and key != X_DELIVERY_COUNT
        }
        headers.update(
            {
                FIRED_BY: self.fired_by,
                ARCHIVE_REASON: self.reason,
                ARCHIVE_SERVICE: self.service,
                ARCHIVE_HANDLER: self.handler,
                ARCHIVE_TASK: self.task,
                ARCHIVE_QUEUE: self.queue,
                ARCHIVE_EXCHANGE: self.exchange,
                ARCHIVE_ROUTING_KEY: self.routing_key,
                ARCHIVE_EXCEPTION_TYPE: self.exception_type,
                ARCHIVE_EXCEPTION_MESSAGE: self.exception_message,
                ARCHIVE_TRACEBACK: self.traceback,
                ARCHIVE_ATTEMPTS: self.attempts,
                ARCHIVE_SECTION: self.section,
            }
        )
        for name, moment in (
            (ARCHIVE_FIRST_FAILURE_AT, self.first_failure_at),
            (ARCHIVE_LAST_FAILURE_AT, self.last_failure_at),
            (ARCHIVED_AT, self.archived_at),
        ):
            if moment is not None:
                headers[name] = isoformat(moment)
        if self.cut:
            headers[ARCHIVE_CUT] = self.cut
        return headers

    @property
    def cut(self) -> str:
        """What of the message could not be kept as it came (headers dropped, a body cut), in words ("": none)."""
        return "" if self.dead_lettered else str(self.headers.get(ARCHIVE_CUT) or "")

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
            "headers": _json_safe(self.recorded_headers()),
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


def _dead_lettered(stored: StoredMessage) -> dict[str, Any]:
    """What is read of a message the broker dead-lettered into an archive: its queue is the dead-letter routing
    key that queue's own arguments set, the reason RabbitMQ's latest death (the first entry of ``x-death``, which
    RabbitMQ writes itself on 3.10 and 4.0); nothing else its headers say, ``archive_*`` and ``x-first-death-*``
    included, is believed."""
    queue = stored.routing_key
    service = dead_lettering_service(stored.exchange) or ""
    deaths = stored.headers.get(X_DEATH)
    death = deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], Mapping) else {}
    said = death.get("reason")
    expired = said == "expired"
    read: dict[str, Any] = {
        ARCHIVE_REASON: Reason.EXPIRED.value if expired else Reason.DEAD_LETTERED.value,
        ARCHIVE_SERVICE: service,
        ARCHIVE_QUEUE: queue if owner_of(queue) == service else "",
        ARCHIVE_EXCEPTION_MESSAGE: (
            "its AMQP expiration passed while it waited in its queue"
            if expired
            else f"the broker dead-lettered it into the archive (RabbitMQ's reason: {str(said)[:40]!r})"
        ),
        ARCHIVED_AT: death.get("time"),
    }
    own = task_of_queue(service, read[ARCHIVE_QUEUE])
    if own is not None:  # its queue is one handler's (per_handler): that handler, and its event, are the facts
        read[ARCHIVE_TASK] = own
    return read


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
