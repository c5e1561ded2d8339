"""What the in-process mode records, and its clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any


@dataclass(frozen=True)
class FiredEvent:
    """An event fired while the in-process mode was on: its payload as handlers receive it."""

    name: str
    id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    fired_by: str | None
    at: datetime
    #: Seconds it waits before reaching its subscribers (``countdown``/``eta``).
    delay: int = 0


@dataclass(frozen=True)
class Run:
    """A message's outcome in one service: one handler run (or a message the worker could not run)."""

    service: str
    #: The handler, as ``module.qualname``; "" for a message no handler could take (e.g. an unknown event).
    handler: str
    event: str
    event_id: str
    #: 1 for the first run, 2 for the first retry, ...
    attempt: int
    #: The outcome's name: ``success``, ``skipped`` (a duplicate, by the inbox), ``retry_scheduled``, ``archived``...
    outcome: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    at: datetime
    #: Seconds until the retry (``retry_scheduled``).
    delay: int | None = None
    #: Why it was archived (``archived``).
    reason: str | None = None
    error: BaseException | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Waiting:
    """A message not handled yet: in a service's queue, or waiting out a delay."""

    event: str
    event_id: str
    #: Where it goes: a service's queue, or ``event.<name>`` for a delayed fire (every subscriber).
    destination: str
    due_at: datetime | None


class VirtualClock:
    """The time of the in-process mode. It starts at the real time and moves only when told to."""

    def __init__(self, start: datetime, mode: Any) -> None:
        self._now, self._mode = start, mode

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: what waited that long arrives, in due order, and is handled at its time."""
        self._mode.run_until(self._now + timedelta(seconds=seconds))

    def move_to(self, moment: datetime) -> None:
        self._now = max(self._now, moment)
