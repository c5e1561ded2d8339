"""Archived copies: what the archive keeps of a message that ran out of retries or can never succeed.

An archived copy is the original message, body and content type byte for
byte, with the ``archive_*`` headers of :mod:`amqp_events.wire.message`
added (:func:`archived_message`); :mod:`amqp_events.wire.archive_entries`
reads one back. Pure: no I/O.
"""

from __future__ import annotations

import traceback as tb
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from amqp_events.clock import SYSTEM_CLOCK
from amqp_events.topology.names import archive_queue_name, to_queue
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
from amqp_events.wire.message import OutgoingMessage, StoredMessage, event_id, isoformat

MAX_EXCEPTION_MESSAGE = 1000
MAX_TRACEBACK = 4096


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
    #: What of the message could not be kept as it came (:mod:`amqp_events.wire.bounds`), "" when nothing.
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


def archived_message(
    delivered: Delivered, failure: Failure, service: str, handler: str, task: str = ""
) -> OutgoingMessage:
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
            ARCHIVE_TASK: task,
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
