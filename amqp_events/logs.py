"""Structured log lines about events: ``<what> event=... service=... id=... attempt=... key=value ...``.

Each line also carries its fields as attributes of the log record (``extra=``),
so that a JSON formatter or structlog can emit them as fields.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


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
    logger.log(level, "%s %s", what, " ".join(parts), extra={"amqp_events": extra})
