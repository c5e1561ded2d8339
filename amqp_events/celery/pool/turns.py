"""Whose turn it is to start, among the processes of one consuming pool: the process holding the event of a limited
handler that has waited longest asks for the next start, so that one worker starts a backlog in the order it was
fired (:class:`~amqp_events.limits.waiting.Peers`). Each process writes, in shared memory, since when it holds an
event of each handler (its line's first), and when the last start it took there stops being counted, so that the
next asks then, not a poll later; the others read it. Of a limit without a key only: a key's events wait in lines
of their own, and other keys go on past them."""

from __future__ import annotations

from amqp_events.celery.pool.shared import Shared
from amqp_events.limits.waiting import gone


class SharedTurns:
    """One process's view of the pool's waiting events."""

    def __init__(self, shared: Shared, slot: int) -> None:
        self.shared, self.slot = shared, slot
        self.index = {name: index for index, name in enumerate(shared.handlers)}
        self.width = max(1, len(shared.handlers))

    def holding(self, handler: str, since: float | None, asks_at: float = 0.0) -> None:
        index = self.index.get(handler)
        if index is not None:
            self.shared.waiting_since[self.slot * self.width + index] = since or 0.0
            self.shared.asks_at[self.slot * self.width + index] = asks_at

    def earlier(self, handler: str, since: float, now: float) -> bool:
        index = self.index.get(handler)
        if index is None:
            return False
        shared = self.shared
        for slot in range(shared.slots):
            at = slot * self.width + index
            waiting = 0.0 < shared.waiting_since[at] < since and not gone(shared.asks_at[at], now)
            if slot != self.slot and waiting and shared.consuming[slot]:
                return True
        return False

    def started(self, handler: str, frees_at: float) -> None:
        index = self.index.get(handler)
        if index is not None:
            self.shared.frees_at[index] = frees_at

    def frees_at(self, handler: str) -> float:
        index = self.index.get(handler)
        return self.shared.frees_at[index] if index is not None else 0.0
