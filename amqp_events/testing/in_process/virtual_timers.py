"""Where the in-process mode's ordered runners run messages: at once, in the test's thread; their held retries
wait on the mode's virtual clock, and run when the mode lets time pass to them."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from datetime import datetime, timedelta


class VirtualTimers:
    """An :class:`~amqp_events.ordering.runner.Executor` on a virtual clock (one for every runner of a mode)."""

    def __init__(self, now: Callable[[], datetime]) -> None:
        self.now = now
        self._due: list[tuple[datetime, int, str, Callable[[], None]]] = []
        self._seq = itertools.count()

    def submit(self, call: Callable[[], None]) -> None:
        call()

    def call_after(self, seconds: float, call: Callable[[], None], tag: str) -> None:
        heapq.heappush(self._due, (self.now() + timedelta(seconds=seconds), next(self._seq), tag, call))

    def cancel(self, tag: str | None = None) -> None:
        self._due = [due for due in self._due if tag is not None and due[2] != tag]
        heapq.heapify(self._due)

    def stop(self) -> None:
        self._due.clear()

    def next_due(self) -> datetime | None:
        return self._due[0][0] if self._due else None

    def run_due(self) -> None:
        """Make every call due by now, in due order."""
        while self._due and self._due[0][0] <= self.now():
            heapq.heappop(self._due)[3]()
