"""Timers: functions called after a delay, all from one thread (a worker may hold hundreds of retries)."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(order=True)
class Due:
    at: float
    seq: int
    call: Callable[[], None] = field(compare=False)
    #: What it belongs to (a partition), to cancel together.
    tag: str = field(compare=False, default="")
    cancelled: bool = field(compare=False, default=False)


class Timers:
    """Call functions after their delays, in a daemon thread of their own, started on first use.

    A call that raises is the caller's business: it is made as given.
    """

    def __init__(self, name: str = "amqp-events-timers") -> None:
        self.name = name
        self._due: list[Due] = []
        self._seq = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def call_after(self, seconds: float, call: Callable[[], None], tag: str = "") -> None:
        with self._changed:
            heapq.heappush(self._due, Due(time.monotonic() + seconds, next(self._seq), call, tag))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._changed.notify()

    def cancel(self, tag: str | None = None) -> None:
        """Cancel the calls of ``tag`` (all of them when ``None``) not made yet."""
        with self._changed:
            for due in self._due:
                if tag in (None, due.tag):
                    due.cancelled = True

    def stop(self) -> None:
        with self._changed:
            self.cancel()
            self._stopped = True
            self._changed.notify()

    def pending(self) -> int:
        with self._changed:
            return sum(not due.cancelled for due in self._due)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._stopped and (not self._due or self._due[0].at > time.monotonic()):
                    self._changed.wait(self._due[0].at - time.monotonic() if self._due else None)
                if self._stopped:
                    return
                due = heapq.heappop(self._due)
            if not due.cancelled:
                due.call()
