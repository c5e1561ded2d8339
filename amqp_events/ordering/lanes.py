"""Lanes: the messages a worker holds, run one at a time per key, in the order they arrived. Pure logic."""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Lanes(Generic[T]):
    """One lane per key: the first item of a key runs at once, the next ones wait for it, in order.

    :meth:`offer` an item as it arrives; when it returns True, run it. When an
    item is finished (acked or archived: never while its retry waits), call
    :meth:`finish` with its key: it returns the next item of that key to run,
    if one waits. Safe to call from several threads.
    """

    def __init__(self) -> None:
        self._waiting: dict[str, deque[T]] = {}
        self._lock = threading.Lock()

    def offer(self, key: str, item: T) -> bool:
        """Take ``item`` of ``key``; True if it may run now (nothing else of its key is running)."""
        with self._lock:
            lane = self._waiting.get(key)
            if lane is None:
                self._waiting[key] = deque()
                return True
            lane.append(item)
            return False

    def finish(self, key: str) -> T | None:
        """The running item of ``key`` is done; returns the next one of ``key`` to run, if any."""
        with self._lock:
            lane = self._waiting.get(key)
            if lane:
                return lane.popleft()
            self._waiting.pop(key, None)  # (or forgotten already: its partition went to another worker)
            return None

    def __len__(self) -> int:
        """Keys with an item running (or waiting for its retry)."""
        with self._lock:
            return len(self._waiting)

    def waiting(self) -> int:
        """Items waiting behind another of their key."""
        with self._lock:
            return sum(len(lane) for lane in self._waiting.values())
