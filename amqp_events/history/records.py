"""Events as the history keeps them, and which of them a search or a replay takes. Pure: no I/O."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from amqp_events.errors import Refused
from amqp_events.topology.ownership import topic_matches
from amqp_events.wire import cloud_events
from amqp_events.wire.message import (
    DUE_AT,
    EVENT_KEY,
    FIRED_AT,
    FIRED_BY,
    StoredMessage,
    event_id,
    event_name,
    parse_time,
)
from amqp_events.wire.trust import Identity, vouch

if TYPE_CHECKING:
    from amqp_events.core.context import ServiceContext

JSON = "application/json"


@dataclass(frozen=True)
class HistoricEvent:
    """One event in the history: where it is (``offset``), what it was, and the message itself."""

    offset: int
    id: str
    event: str
    key: str | None
    fired_by: str
    fired_at: datetime | None
    #: When a delayed fire was due (it entered the history then).
    due_at: datetime | None
    message: StoredMessage = field(repr=False)

    @cached_property
    def _arguments(self) -> tuple[list[Any] | None, dict[str, Any] | None]:
        """Its body decoded, once, and only when a filter or a key needs it."""
        return _arguments(self.message)

    @property
    def args(self) -> list[Any] | None:
        """Its positional arguments, when its body is readable (JSON, or a CloudEvent's data)."""
        return self._arguments[0]

    @property
    def kwargs(self) -> dict[str, Any] | None:
        """Its keyword arguments, when its body is readable."""
        return self._arguments[1]

    @classmethod
    def read(cls, offset: int, message: StoredMessage, reader: Identity | None = None) -> HistoricEvent:
        """The event at ``offset``; as ``reader`` may believe it, when given (:mod:`amqp_events.wire.trust`: its
        verified author, and none of the headers only the reader's own copies may carry)."""
        if reader is not None:
            vouched = dict(message.headers)
            vouch(reader, message.user_id, vouched)
            message = replace(message, headers=vouched)
        headers = message.headers
        if cloud_events.is_cloud_event(headers, message.content_type):
            # Unreadable: listed with what its headers say (a worker archives it with the reason).
            with contextlib.suppress(Refused):
                headers = {**headers, **cloud_events.read(headers, message.body, message.content_type).headers}
        key = headers.get(EVENT_KEY)
        return cls(
            offset=offset,
            id=event_id(headers),
            event=event_name(headers),
            key=None if key is None else str(key),
            fired_by=str(headers.get(FIRED_BY) or ""),
            fired_at=parse_time(headers.get(FIRED_AT)),
            due_at=parse_time(headers.get(DUE_AT)),
            message=message,
        )

    @property
    def at(self) -> datetime | None:
        """When it entered the history: when it was fired, or when it was due for a delayed fire."""
        return self.due_at or self.fired_at

    def fields(self, names: Sequence[str] = ()) -> dict[str, Any]:
        """Its arguments by name: keywords as they are, positional ones named by ``names`` (or by position)."""
        positional = {
            (names[index] if index < len(names) else str(index)): value for index, value in enumerate(self.args or [])
        }
        return {**positional, **(self.kwargs or {})}

    def summary(self, names: Sequence[str] = ()) -> dict[str, Any]:
        """What ``history find`` and ``history show`` print (JSON-safe)."""
        return {
            "offset": self.offset,
            "id": self.id,
            "event": self.event,
            "key": self.key,
            "fired_by": self.fired_by,
            "fired_at": _iso(self.fired_at),
            "due_at": _iso(self.due_at),
            "arguments": self.fields(names) if self.args is not None or self.kwargs is not None else None,
        }


@dataclass(frozen=True)
class Query:
    """Which events a search or a replay takes (every given criterion must match)."""

    #: Events that entered the history at or after this time...
    since: datetime | None = None
    #: ...and before this one.
    until: datetime | None = None
    #: Event names matching this pattern, as a topic binding matches routing keys (``billing.*``, ``billing.#``).
    events: str | None = None
    #: Arguments (or the event's ``id``, ``key``, ``fired_by``) equal to these values, compared as text or JSON.
    where: Mapping[str, str] = field(default_factory=dict)

    def matches(self, event: HistoricEvent, names: Sequence[str] = ()) -> bool:
        at = event.at
        if self.since is not None and (at is None or at < self.since):
            return False
        if self.until is not None and (at is None or at >= self.until):
            return False
        if self.events is not None and not topic_matches(self.events, event.event):
            return False
        if self.where:
            known = {"id": event.id, "key": event.key, "fired_by": event.fired_by, **event.fields(names)}
            return all(name in known and _equal(known[name], value) for name, value in self.where.items())
        return True

    def passed(self, event: HistoricEvent) -> bool:
        """Is ``event`` past the end of the window (so, with the history in order, are all that follow)?"""
        return self.until is not None and event.at is not None and event.at >= self.until


#: Producers' clocks and the broker's differ a little, and a stream starts a reading at a time only to the
#: chunk: a reading from a time starts this much earlier, and a reading up to a time stops this much later.
CLOCK_MARGIN = timedelta(seconds=60)


def start_of(query: Query) -> int | datetime:
    """Where a reading for ``query`` starts in the stream: its first offset, or a little before ``since``."""
    return 0 if query.since is None else query.since - CLOCK_MARGIN


def events_in(
    messages: Iterator[tuple[int, StoredMessage]],
    query: Query,
    names: Callable[[str], Sequence[str]],
    reader: Identity | None = None,
) -> Iterator[HistoricEvent]:
    """The events of a stream reading that ``query`` takes (as ``reader`` believes them), stopping well past its
    ``until``."""
    for offset, message in messages:
        event = HistoricEvent.read(offset, message, reader)
        if query.until is not None and event.at is not None and event.at >= query.until + CLOCK_MARGIN:
            return
        if query.matches(event, names(event.event)):
            yield event


class NamesOf:
    """The names of an event's positional arguments, from the service's handlers and declared events."""

    def __init__(self, context: ServiceContext, declared: dict[str, Sequence[str]] | None = None) -> None:
        self.known: dict[str, Sequence[str]] = {event: h.argument_names for event, h in context.handlers.items()}
        self.known.update(declared or {})

    def __call__(self, event: str) -> Sequence[str]:
        return self.known.get(event, ())


def parse_where(conditions: Sequence[str]) -> dict[str, str]:
    """``["invoice_id=42", "currency=EUR"]`` as a dict; ``ValueError`` for a condition without ``=``."""
    where = {}
    for condition in conditions:
        name, equals, value = condition.partition("=")
        if not equals or not name.strip():
            raise ValueError(f"a condition is NAME=VALUE, not {condition!r}")
        where[name.strip()] = value
    return where


def _arguments(message: StoredMessage) -> tuple[list[Any] | None, dict[str, Any] | None]:
    if message.content_type != JSON and not cloud_events.is_cloud_event(message.headers, message.content_type):
        return None, None
    try:
        body = json.loads(message.body.decode(message.content_encoding or "utf-8"))
    except (ValueError, LookupError, RecursionError):
        return None, None
    if isinstance(body, list) and len(body) == 3 and isinstance(body[0], list) and isinstance(body[1], dict):
        return body[0], body[1]  # Celery's task body: args, kwargs, embed
    if isinstance(body, dict):
        data = body.get("data") if "specversion" in body else body  # structured or binary CloudEvent
        return [], data if isinstance(data, dict) else {"data": data}
    return None, None


def _equal(actual: Any, wanted: str) -> bool:
    return str(actual) == wanted or json.dumps(actual) == wanted


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None
