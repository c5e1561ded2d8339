"""What the consuming pool's processes share with its main process, in memory made before they fork.

* Hard deadlines: each process writes the earliest deadline of its runs to its slot; the main process kills a
  process whose run is past it. Shared, not sent: a process stuck in a handler cannot send anything.
* Which processes consume (connected, their consumer started): the main process's readiness probe.
* The queues the operator stopped the worker consuming (``celery control cancel_consumer``, until
  ``add_consumer``): the main process answers remote control, each process follows.
* Runs in progress: each process writes which runs it is in (handler, event id, retries, lost runs so far). The
  process that gets such a message again counts the loss (as Celery's prefork pool does). When it dies, the main
  process keeps its runs a while among the lost runs.
* How many processes ended: the messages an ended process had only prefetched come back with the broker's count
  of returns raised. Returns up to that many are not charged to a message (a poison killing process after
  process would otherwise exhaust the returns of every event prefetched beside it).

Each process writes its own slot only; the lost runs are shared by all, under a lock.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

#: Runs of one process whose loss can be told apart (more at once, with coroutine handlers: the broker's
#: count of returns decides for the others).
RUNS_PER_SLOT = 4
#: Lost runs remembered until their message comes back (the oldest are forgotten first).
LOST_KEPT = 64
KEY_BYTES = 200


@dataclass(frozen=True)
class Overdue:
    """A run past its hard time limit: in which process slot, of which handler."""

    slot: int
    handler: str


def run_key(handler: str, event_id: str, retries: int, lost_runs: int) -> bytes:
    """One run of one message: a copy sent back (retried, or counted as lost) is another run."""
    return f"{handler}|{event_id}|{retries}|{lost_runs}".encode()[:KEY_BYTES]


class Shared:
    """The pool's shared memory: per process slot, a deadline and the runs in progress; the lost runs; the
    queues cancelled by remote control."""

    def __init__(
        self, slots: int, handlers: Sequence[str], queues: Sequence[str] = (), cancelled: Collection[str] = ()
    ) -> None:
        slots = max(1, slots)
        self.handlers = tuple(handlers)
        self.queues = tuple(queues)
        self.cancelled = multiprocessing.RawArray("b", [int(queue in cancelled) for queue in self.queues] or [0])
        #: Is the slot's process consuming (connected, its consumer started)? The main process's readiness.
        self.consuming = multiprocessing.RawArray("b", slots)
        self.deadline = multiprocessing.RawArray("d", slots)
        self.deadline_of = multiprocessing.RawArray("i", slots)
        #: Has the slot's process begun a run yet? (One that dies before failed at its start.)
        self.ran = multiprocessing.RawArray("b", slots)
        self.runs = [multiprocessing.RawArray("c", KEY_BYTES * RUNS_PER_SLOT) for _ in range(slots)]
        self.lost = multiprocessing.RawArray("c", KEY_BYTES * LOST_KEPT)
        self.lost_next = multiprocessing.RawValue("i", 0)
        #: Processes that ended since the worker started (each gave back what it had prefetched).
        self.ended = multiprocessing.RawValue("i", 0)
        self.lock = multiprocessing.Lock()

    # -- the main process ------------------------------------------------------------------------------------

    def overdue(self, now: float) -> list[Overdue]:
        """The slots whose run is past its deadline."""
        return [
            Overdue(slot, self.handlers[index] if 0 <= (index := self.deadline_of[slot]) < len(self.handlers) else "?")
            for slot, deadline in enumerate(self.deadline)
            if deadline and now > deadline
        ]

    def process_ended(self, slot: int) -> None:
        """The process of ``slot`` died: its runs in progress are lost runs now."""
        self.deadline[slot] = 0.0
        self.consuming[slot] = 0
        with self.lock:
            self.ended.value += 1
            keys = [key for key in _entries(self.runs[slot], RUNS_PER_SLOT) if key]
            self.runs[slot][:] = bytes(len(self.runs[slot]))
            for key in keys:
                at = self.lost_next.value
                _put(self.lost, at, key)
                self.lost_next.value = (at + 1) % LOST_KEPT

    def consume(self, queue: str, consuming: bool) -> bool:
        """The worker consumes ``queue`` again, or no longer; ``False`` for a queue that is not the app's."""
        if queue not in self.queues:
            return False
        self.cancelled[self.queues.index(queue)] = not consuming
        return True

    # -- a process ---------------------------------------------------------------------------------------------

    def cancelled_queues(self) -> set[str]:
        """The queues no process of the worker consumes now (read at every tick of each process)."""
        return {queue for queue, cancelled in zip(self.queues, self.cancelled, strict=False) if cancelled}

    def was_lost(self, key: bytes) -> bool:
        """Was this run lost? A message is given to one consumer at a time: if a run of it is still written down
        (in a slot, or among the lost runs), the process that ran it died (or lost its connection) before an
        outcome. The entry is then forgotten: the copy sent back for the loss is another run."""
        with self.lock:
            for array in (self.lost, *self.runs):
                index = _find(array, key)
                if index is not None:
                    _put(array, index, b"")
                    return True
        return False


class SlotRuns:
    """One process's view of its slot: its runs in progress, and the earliest hard deadline among them.

    A process may run several at once (coroutines, ordered keys on threads).
    """

    def __init__(self, shared: Shared, slot: int) -> None:
        self.shared, self.slot = shared, slot
        self.lock = threading.Lock()
        self.deadlines: dict[int, tuple[float, int]] = {}
        self.next_token = 0
        shared.deadline[slot] = 0.0

    def started(self, key: bytes) -> int | None:
        """A run began: its place in the slot (``None``: the slot is full)."""
        self.shared.ran[self.slot] = 1
        with self.shared.lock:
            free = _find(self.shared.runs[self.slot], b"")  # an empty entry
            if free is not None:
                _put(self.shared.runs[self.slot], free, key)
            return free

    def ended(self, place: int | None) -> None:
        if place is not None:
            with self.shared.lock:
                _put(self.shared.runs[self.slot], place, b"")

    def limit(self, handler: str, seconds: float) -> int:
        """A run of ``handler`` must end within ``seconds``; returns the token that ends the limit."""
        index = self.shared.handlers.index(handler) if handler in self.shared.handlers else -1
        with self.lock:
            self.next_token += 1
            self.deadlines[self.next_token] = (time.monotonic() + seconds, index)
            self._write()
            return self.next_token

    def unlimit(self, token: int) -> None:
        with self.lock:
            self.deadlines.pop(token, None)
            self._write()

    def _write(self) -> None:
        if not self.deadlines:
            self.shared.deadline[self.slot] = 0.0
            return
        deadline, index = min(self.deadlines.values())
        self.shared.deadline_of[self.slot] = index  # first: a reader that sees the deadline sees its handler
        self.shared.deadline[self.slot] = deadline


def _find(array: Any, key: bytes) -> int | None:
    """The entry of ``array`` that holds ``key`` (a search of the raw bytes: this runs for every message)."""
    raw, wanted = array.raw, key.ljust(KEY_BYTES, b"\0")
    at = raw.find(wanted)
    while at != -1 and at % KEY_BYTES:
        at = raw.find(wanted, at + 1)
    return None if at == -1 else at // KEY_BYTES


def _entries(array: Any, count: int) -> list[bytes]:
    raw = bytes(array)
    return [raw[index * KEY_BYTES : (index + 1) * KEY_BYTES].rstrip(b"\0") for index in range(count)]


def _put(array: Any, index: int, key: bytes) -> None:
    array[index * KEY_BYTES : (index + 1) * KEY_BYTES] = key.ljust(KEY_BYTES, b"\0")
