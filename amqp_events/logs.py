"""Structured log lines about events: ``<what> event=... service=... id=... attempt=... key=value ...``.

Each line also carries its fields as attributes of the log record (``extra=``:
``event``, ``service``, ``event_id``, ``attempt``, ``handler``..., and
``trace_id``/``span_id`` with tracing on), so that :class:`JsonFormatter`,
any other JSON formatter or structlog's ``ExtraAdder`` emits them as fields.
With ``amqp_events_log_format = "json"`` a worker logs every line as JSON.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

from celery import current_app, signals

from amqp_events import tracing

logger = logging.getLogger(__name__)

#: Attributes every ``LogRecord`` has: anything else on a record came from ``extra=``.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


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
    logger.log(level, "%s %s", what, " ".join(parts), extra={**extra, **tracing.log_fields()})


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


def _json_in_workers(logger: logging.Logger, **_: Any) -> None:
    """A worker of an app with ``amqp_events_log_format = "json"`` writes its log lines as JSON."""
    settings = getattr(current_app, "events_settings", None)
    if settings is not None and settings.log_format == "json":
        for handler in logger.handlers:
            handler.setFormatter(JsonFormatter())


signals.after_setup_logger.connect(_json_in_workers)
signals.after_setup_task_logger.connect(_json_in_workers)
