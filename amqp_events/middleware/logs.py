"""Structured log lines about events: ``<what> event=... service=... id=... attempt=... key=value ...``.

Each line also carries its fields as attributes of the log record (``extra=``:
``event``, ``service``, ``event_id``, ``attempt``, ``handler``..., and
``trace_id``/``span_id`` with tracing on), so that :class:`JsonFormatter`,
any other JSON formatter or structlog's ``ExtraAdder`` emits them as fields.
With ``amqp_events_log_format = "json"`` a worker logs every line as JSON.

What is logged, by :class:`EventLog`: ``fired`` (info; not for events fired
in a batch), ``handled`` (debug: Celery logs every success already),
``duplicate skipped`` (info), ``retrying``, ``redelivering`` and ``handed
back, breaker open`` (warning: a failing handler is worth seeing with a
worker's default log level), ``handed back, its process stops`` (debug: a
recycled or stopping pool process gives back what it took in its last turn;
it says so once, at info), ``waiting, over its limit`` (debug: flow control
at work, as often as a backlog comes round), ``archived`` (warning; error for a message no
handler could take: the sender's mistake), ``replayed`` (info).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

from amqp_events.core.context import Attempt, Firing, Middleware, Replay
from amqp_events.core.outcome import Ack, Hold, Outcome, Redeliver
from amqp_events.core.publishing import describe
from amqp_events.errors import ProcessStopping
from amqp_events.middleware.tracing import log_fields
from amqp_events.wire.message import event_id

#: Named for what it logs (not for its module): configure ``amqp_events.logs`` to see the events' lines.
logger = logging.getLogger("amqp_events.logs")

#: Attributes every ``LogRecord`` has: anything else on a record came from ``extra=``.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
#: What a line says, by outcome name (:mod:`amqp_events.core.outcome`), and how loud.
_SAID = {
    "success": ("handled", logging.DEBUG),
    "skipped": ("duplicate skipped", logging.INFO),
    "retry_scheduled": ("retrying", logging.WARNING),
    "redelivered": ("redelivering", logging.WARNING),
    "handed_back": ("handed back, breaker open", logging.WARNING),
    "over_limit": ("waiting, over its limit", logging.DEBUG),
    "postponed": ("postponed until its eta", logging.INFO),
    "archived": ("archived", logging.WARNING),
    "held": ("held, over its limit", logging.DEBUG),
}


def log_event(
    what: str,
    *,
    event: str,
    service: str,
    event_id: str,
    attempt: int | None = None,
    level: int = logging.INFO,
    **fields: Any,
) -> None:
    """One line per thing that happened to an event: fired, handled, retrying, archived, replayed."""
    if not logger.isEnabledFor(level):
        return
    parts = [f"event={event}", f"service={service}", f"id={event_id}"]
    if attempt is not None:
        parts.append(f"attempt={attempt}")
    parts.extend(f"{key}={value}" for key, value in fields.items())
    extra = {"event": event, "service": service, "event_id": event_id, "attempt": attempt, **fields}
    logger.log(level, "%s %s", what, " ".join(parts), extra={**extra, **log_fields()})


class EventLog(Middleware):
    """The lines above, from the hooks of firing, handling and replaying."""

    def after_fire(self, firing: Firing, result: str, error: BaseException | None) -> None:
        if firing.batched or result not in ("confirmed", "unroutable") or not logger.isEnabledFor(logging.INFO):
            return
        message = firing.message
        log_event(
            "fired", event=message.event, service=firing.context.name, event_id=message.message_id,
            delayed=bool(firing.delay),
        )  # fmt: skip

    def after_handle(self, attempt: Attempt, outcome: Outcome | None, error: BaseException | None) -> None:
        if outcome is None:
            return
        what, level = _SAID[outcome.name]
        if isinstance(outcome, Redeliver) and isinstance(outcome.error, ProcessStopping):
            what, level = "handed back, its process stops", logging.DEBUG
        if not logger.isEnabledFor(level):
            return
        fields: dict[str, Any] = {}
        if isinstance(outcome, Redeliver):
            fields = {"delay": outcome.delay, "error": describe(outcome.error)}
        elif isinstance(outcome, Hold):
            fields = {"wait": f"{outcome.seconds:.3f}", "error": describe(outcome.error)}
        elif not isinstance(outcome, Ack):
            fields = {"reason": outcome.reason, "error": describe(outcome.error)}
            if attempt.handler is None:  # no handler could take it: an error of whoever sent it
                level = logging.ERROR
        delivery = attempt.delivery
        log_event(
            what,
            event=delivery.event,
            service=attempt.context.name,
            event_id=delivery.event_id,
            attempt=delivery.retries + 1,
            level=level,
            handler=attempt.handler.name if attempt.handler is not None else "-",
            **fields,
        )

    def after_replay(self, replay: Replay, error: BaseException | None) -> None:
        if error is None:
            log_event(
                "replayed", event=replay.message.event, service=replay.context.name,
                event_id=event_id(replay.archived_headers), queue=replay.message.routing_key, replayed_by=replay.by,
            )  # fmt: skip


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, ``message``, the ``extra=`` fields of the
    record (an event's ``event_id``, ``event``, ``service``..., ``trace_id``/``span_id``), and ``exception``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update((key, value) for key, value in vars(record).items() if key not in _RECORD_ATTRIBUTES)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)
