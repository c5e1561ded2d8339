"""Structured log lines: ``<what> event=... service=... id=... attempt=... key=value ...``."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("amqp_events")


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
    logger.log(level, "%s %s", what, " ".join(parts))
