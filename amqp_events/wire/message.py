"""Event messages on the wire: Celery's task protocol 2 plus a few documented headers.

An event is an ordinary Celery task message, so a plain ``celery worker``
runs it: the ``task`` header is the event name, ``id`` is the event id and
``retries`` counts the retries so far. The library adds:

==================== ========================================================
``fired_at``         ISO-8601 UTC time the event was fired (kept across retries)
``fired_by``         the service that fired it, as its receiver verified it (:mod:`amqp_events.wire.trust`)
``first_failure_at`` ISO-8601 UTC time its handler first failed (retries only)
``due_at``           ISO-8601 UTC time a delayed copy's wait ends (delayed only)
``lost_runs``        how many times the process running it died (redelivered copies)
``section_retries``  retries used per ``retry`` section of the handler, by section name
``failed_section``   the section whose failure caused this retry (absent: the handler's own policy)
``event_key``        the event's key: the aggregate it belongs to (``@app.event(key=...)``; absent: none)
``replayed_by``      who replayed it from the archive (copies of a replay)
==================== ========================================================

Archived copies carry the ``archive_*`` headers of :mod:`amqp_events.wire.archive_headers`.
Everything here is pure: building and reading messages, no I/O.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any

from kombu.utils.json import dumps as json_dumps

from amqp_events.topology import delays
from amqp_events.topology.names import EVENT_KEY_HEADER, EVENT_SLOT_HEADER
from amqp_events.wire.archive_headers import ARCHIVE_HEADERS
from amqp_events.wire.parked import PARKING_HEADERS

FIRED_AT = "fired_at"
FIRED_BY = "fired_by"
FIRST_FAILURE_AT = "first_failure_at"
DUE_AT = "due_at"
LOST_RUNS = "lost_runs"
SECTION_RETRIES = "section_retries"
FAILED_SECTION = "failed_section"
#: The task name of the one handler a copy is for (a fired event's copy per handler in a service queue shared by
#: several handlers of its event, and every copy made of it: retries, archived copies, replays).
FOR_HANDLER = "for_handler"
#: The event a copy's message was fired as, as the broker routed it when it first came in (a replay of an
#: archived message that never reached a handler carries it: the router judges the copy by it, as it judged the
#: original).
FIRED_AS = "fired_as"
EVENT_KEY = EVENT_KEY_HEADER
EVENT_SLOT = EVENT_SLOT_HEADER
#: The version of the event's arguments it was fired with (``@app.event(..., version=N)``); without it, 1.
EVENT_VERSION = "event_version"
#: A key is a short string, an AMQP header value.
_MAX_KEY = 255
#: Celery's protocol-2 headers a copy keeps (the others are per delivery or unused here).
ENVELOPE = ("task", "id", "root_id", "parent_id", "group", "origin", "lang", "retries")

#: Headers RabbitMQ adds on dead-lettering and redelivery.
X_DEATH = "x-death"
X_DELIVERY_COUNT = "x-delivery-count"
#: Every header RabbitMQ writes when it dead-letters a message: a sender may have written them all beforehand
#: (RabbitMQ 3.10 keeps a sender's ``x-first-death-*`` when the message already carries an ``x-death``).
DEATH_HEADERS = (
    X_DEATH,
    *(f"x-{at}-death-{what}" for at in ("first", "last") for what in ("queue", "reason", "exchange")),
)

EMPTY_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
JSON = "application/json"


def isoformat(moment: datetime) -> str:
    return (moment if moment.tzinfo is timezone.utc else moment.astimezone(timezone.utc)).isoformat()


def parse_time(value: Any) -> datetime | None:
    """A header timestamp back to an aware datetime (``None`` when absent or unreadable)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, str):
        try:
            return parse_time(datetime.fromisoformat(value))
        except ValueError:
            return None
    return None


@dataclass(frozen=True)
class StoredMessage:
    """A message as it sits in a queue: what browsing a queue returns."""

    headers: Mapping[str, Any]
    body: bytes
    content_type: str | None
    content_encoding: str | None
    #: The RabbitMQ user that published it, as the broker verified it (``None``: it did not say).
    user_id: str | None = None
    #: How the broker routed it into its queue: the exchange it was published (or dead-lettered) to, and with
    #: which routing key (what a browse of the queue reads off each delivery; "" when not known).
    exchange: str = ""
    routing_key: str = ""


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """A message ready for :mod:`amqp_events.transport.publisher`.

    ``body`` is serialised as JSON unless ``content_type`` is given, in which
    case it must already be ``bytes`` (archived copies keep the original bytes).
    """

    exchange: str
    routing_key: str
    headers: dict[str, Any]
    body: Any
    message_id: str
    content_type: str | None = None
    content_encoding: str | None = None

    @property
    def event(self) -> str:
        """The event it fires, in either wire format."""
        return event_name(self.headers)

    @property
    def delayed(self) -> bool:
        """Does it wait on a delay ladder first?"""
        return delays.is_ladder_level(self.exchange)

    def after(self, delay: int, destination: str, now: datetime, entry: str = delays.ENTRY_EXCHANGE) -> OutgoingMessage:
        """This message, waiting ``delay`` whole seconds on the ladder whose entry is ``entry`` (the shared one, or
        a service's own) before it reaches ``destination``.

        The one place a delayed copy is addressed: a delayed fire, a retry.
        """
        if not delay:
            return self
        return replace(
            self,
            exchange=entry,
            routing_key=delays.routing_key(delay, destination),
            headers={**self.headers, DUE_AT: isoformat(now + timedelta(seconds=delay))},
        )


def event_envelope(
    name: str,
    args: tuple[Any, ...] | list[Any],
    kwargs: Mapping[str, Any],
    fired_by: str,
    now: datetime,
    event_id: str | None = None,
    key: str | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """Headers and body of an event fired ``now`` (under a new id unless ``event_id`` is given), with its
    ``key`` (see :func:`event_key`) if it has one."""
    # Only what a worker needs: Celery reads every other protocol-2 header with a default.
    headers = {
        "task": name,
        "id": new_event_id(event_id),
        FIRED_AT: isoformat(now),
        FIRED_BY: fired_by,
    }
    if key is not None:
        headers[EVENT_KEY] = key
    return headers, [list(args), dict(kwargs), EMPTY_EMBED]


def event_key(value: Any) -> str:
    """An event's key as it travels: a string of 1 to 255 characters, or an integer written in decimal.

    The key names the aggregate an event belongs to (an order id, an account id):
    anything else (``None``, a float, a dict) is refused here, before anything is published.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not (isinstance(value, str) and 0 < len(value) <= _MAX_KEY):
        raise ValueError(f"an event key must be a string of 1 to {_MAX_KEY} characters or an integer, not {value!r}")
    return value


def new_event_id(given: str | None = None) -> str:
    """The id of a newly fired event: ``given`` (checked), or a new UUID."""
    if given is None:
        return str(uuid.uuid4())
    if not (isinstance(given, str) and 0 < len(given.strip()) == len(given) <= 64):
        # 64: the width of the outbox's and the inbox's event id columns.
        raise ValueError(f"an event id must be a string of 1 to 64 characters without outer spaces, not {given!r}")
    return given


def event_name(headers: Mapping[str, Any]) -> str:
    """The event a message fires: its ``task`` header (without the handler's name a copy for one named handler
    carries: ``user.created:welcome_email``), or its ``ce-type`` (:mod:`amqp_events.wire.cloud_events`)."""
    return str(headers.get("task") or headers.get("ce-type") or "").partition(":")[0]


def event_id(headers: Mapping[str, Any]) -> str:
    """The event id of a message: its ``id`` header, or its ``ce-id``."""
    return str(headers.get("id") or headers.get("ce-id") or "")


def json_text(body: Any) -> str:
    """``body`` serialised exactly as kombu's JSON serializer does: kombu's encoder only adds types (dates,
    UUIDs, ``__json__``) to the standard library's, so what that takes it writes alike, without kombu's
    encoder made afresh for each message."""
    try:
        return _plain_json(body)
    except (TypeError, ValueError):  # a type only kombu's encoder writes, or what neither can (kombu says why)
        text: str = json_dumps(body)
        return text


_plain_json = json.JSONEncoder().encode


def json_body(body: Any) -> bytes:
    """``body`` serialised exactly as kombu serialises a JSON message."""
    return json_text(body).encode("utf-8")


def is_task_body(body: Any) -> bool:
    """Is ``body`` a Celery protocol-2 task body, ``[args, kwargs, embed]``?"""
    return (
        isinstance(body, (list, tuple))
        and len(body) == 3
        and isinstance(body[0], (list, tuple))
        and isinstance(body[1], dict)
        and (body[2] is None or isinstance(body[2], dict))
    )


def copy_headers(original: Mapping[str, Any], retries: int, **extra: Any) -> dict[str, Any]:
    """Headers for a new copy of ``original`` (a retry, a replay): the event's own and the
    application's headers are kept; the broker's history, archive records and per-copy timing are not.
    A copy that starts over (``retries`` 0, a replay) starts its sections' counts over too."""
    headers = {key: value for key, value in original.items() if not _one_copy_only(key)}
    if not retries:
        headers.pop(SECTION_RETRIES, None)
        headers.pop(FAILED_SECTION, None)
    headers["retries"] = retries
    headers.update({key: value for key, value in extra.items() if value is not None})
    return headers


def _one_copy_only(key: str) -> bool:
    return key.startswith("x-") or key in ARCHIVE_HEADERS or key in PARKING_HEADERS or key in ONE_COPY_ONLY


@dataclass(frozen=True)
class EventMetadata:
    """What a handler may want to know about the event it is running for.

    Read it inside a handler with :func:`amqp_events.current_event`.
    """

    id: str
    name: str
    #: When the event was fired (not when it is being handled): use it for time-window checks.
    fired_at: datetime | None
    fired_by: str | None
    #: 1 for the first run, 2 for the first retry, ...
    attempt: int
    #: The handler section (:mod:`amqp_events.core.sections`) whose failure caused this retry, if one did.
    failed_section: str | None = None
    #: The event's key (the ``event_key`` header), if it was fired with one.
    key: str | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, Any]) -> EventMetadata:
        return cls(
            id=str(headers.get("id")),
            name=str(headers.get("task")),
            fired_at=parse_time(headers.get(FIRED_AT)),
            fired_by=headers.get(FIRED_BY) or None,
            attempt=int(headers.get("retries") or 0) + 1,
            failed_section=headers.get(FAILED_SECTION) or None,
            key=headers.get(EVENT_KEY) or None,
        )


def section_retries(headers: Mapping[str, Any]) -> dict[str, int]:
    """Retries used so far per ``retry`` section (the ``section_retries`` header; unreadable entries skipped)."""
    counts = headers.get(SECTION_RETRIES)
    if not isinstance(counts, Mapping):
        return {}
    return {str(name): n for name, n in counts.items() if isinstance(n, int) and n >= 0}


def queue_wait(headers: Mapping[str, Any], now: datetime) -> float | None:
    """Seconds a message waited in its queue: since it was due (fired, or its delay over)."""
    due = parse_time(headers.get(DUE_AT)) or parse_time(headers.get(FIRED_AT))
    return None if due is None else (now - due).total_seconds()


def was_rejected(headers: Mapping[str, Any], queue: str) -> bool:
    """Did ``queue`` dead-letter this message as rejected (it came back to be counted)? The broker puts its
    latest death first (the router keeps ``x-death`` only on what came back through the dead-letter exchange)."""
    deaths = headers.get(X_DEATH)
    latest = deaths[0] if isinstance(deaths, list) and deaths else None
    return isinstance(latest, Mapping) and latest.get("queue") == queue and latest.get("reason") == "rejected"


def delivery_count(headers: Mapping[str, Any]) -> int:
    """How many times the broker delivered this message before without an ack or a reject."""
    try:
        return int(headers.get(X_DELIVERY_COUNT) or 0)
    except (TypeError, ValueError):
        return 0


#: Headers of one copy only, never carried on to its retries or replays.
ONE_COPY_ONLY = (DUE_AT, LOST_RUNS)


class Reason(str, Enum):
    """Why a message was archived (the ``archive_reason`` header)."""

    MAX_RETRIES = "max_retries"
    NON_RETRYABLE = "non_retryable"
    WORKER_LOST = "worker_lost"
    UNDECODABLE = "undecodable"
    FORBIDDEN_CONTENT_TYPE = "forbidden_content_type"
    UNKNOWN_EVENT = "unknown_event"
    BAD_ARGUMENTS = "bad_arguments"
    #: It failed inside a ``poisonous()`` section: it can never succeed on a retry.
    POISONOUS = "poisonous"
    #: A CloudEvent without a required attribute, of another specversion, or with a malformed attribute.
    INVALID_CLOUDEVENT = "invalid_cloudevent"
    #: A header of the wrong type (an ``id`` that is a table), too long or too deep (:mod:`amqp_events.wire.bounds`).
    MALFORMED_HEADERS = "malformed_headers"
    #: A body larger than a worker takes (``amqp_events_max_body_bytes``, decompressed), or headers larger than a
    #: copy can carry (:data:`~amqp_events.wire.bounds.MAX_HEADERS_BYTES`): archived cut, saying what was cut.
    TOO_LARGE = "too_large"
    #: Its body's embed asks Celery to run other tasks with it (``callbacks``, ``errbacks``, ``chain``, ``chord``):
    #: an event never starts tasks a sender chose.
    EMBEDDED_WORKFLOW = "embedded_workflow"
    #: Event ownership is on and the service the broker verified as its author does not own the event.
    NOT_OWNER = "not_owner"
    #: Its ``expires`` header had passed when it arrived (Celery's expiry, honoured by archiving it unrun), or its
    #: AMQP ``expiration`` passed while it waited in its queue (the broker dead-lettered it to the archive).
    EXPIRED = "expired"
    #: The broker dead-lettered it into the archive for another reason than its expiration (RabbitMQ 3.10 routes
    #: by the ``x-first-death-*`` headers, which a sender can write beforehand): RabbitMQ's word is in the message.
    DEAD_LETTERED = "dead_lettered"
    #: The broker refused the copy that was to wait on the delay ladder (a level over its byte bound): the message
    #: is archived rather than sent round again.
    DELAY_REFUSED = "delay_refused"
    #: Celery's remote control revoked its id (``celery control revoke``, with ``--terminate`` while it ran).
    REVOKED = "revoked"

    def __str__(self) -> str:
        return self.value
