"""The headers an archived copy carries (:mod:`amqp_events.wire.archived` writes them, and
:mod:`amqp_events.wire.archive_entries` reads them back)."""

from __future__ import annotations

ARCHIVE_REASON = "archive_reason"
ARCHIVE_SERVICE = "archive_service"
ARCHIVE_HANDLER = "archive_handler"
#: The handler task the worker chose for it by the queue and the event ("" when it chose none): what a replay
#: routes by.
ARCHIVE_TASK = "archive_task"
ARCHIVE_QUEUE = "archive_queue"
ARCHIVE_EXCHANGE = "archive_exchange"
ARCHIVE_ROUTING_KEY = "archive_routing_key"
ARCHIVE_EXCEPTION_TYPE = "archive_exception_type"
ARCHIVE_EXCEPTION_MESSAGE = "archive_exception_message"
ARCHIVE_TRACEBACK = "archive_traceback"
ARCHIVE_ATTEMPTS = "archive_attempts"
ARCHIVE_SECTION = "archive_section"
ARCHIVE_FIRST_FAILURE_AT = "archive_first_failure_at"
ARCHIVE_LAST_FAILURE_AT = "archive_last_failure_at"
ARCHIVED_AT = "archived_at"
#: What of a message could not be kept as it came (headers dropped, a body cut: :mod:`amqp_events.wire.bounds`),
#: in words; only on the archived copy made of it.
ARCHIVE_CUT = "archive_cut"
#: W3C ``traceparent`` of the attempt that archived the message (with tracing on).
ARCHIVE_TRACEPARENT = "archive_traceparent"
#: W3C ``traceparent`` of the replay that sent the message back (with tracing on; kept through its retries).
REPLAY_TRACEPARENT = "replay_traceparent"
ARCHIVE_HEADERS = (
    ARCHIVE_REASON,
    ARCHIVE_SERVICE,
    ARCHIVE_HANDLER,
    ARCHIVE_TASK,
    ARCHIVE_QUEUE,
    ARCHIVE_EXCHANGE,
    ARCHIVE_ROUTING_KEY,
    ARCHIVE_EXCEPTION_TYPE,
    ARCHIVE_EXCEPTION_MESSAGE,
    ARCHIVE_TRACEBACK,
    ARCHIVE_ATTEMPTS,
    ARCHIVE_SECTION,
    ARCHIVE_FIRST_FAILURE_AT,
    ARCHIVE_LAST_FAILURE_AT,
    ARCHIVED_AT,
    ARCHIVE_TRACEPARENT,
    ARCHIVE_CUT,
)
