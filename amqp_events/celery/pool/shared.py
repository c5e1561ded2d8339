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
* What Celery's remote control asks about (:mod:`amqp_events.celery.pool.mirror`): each run in progress as
  ``inspect active`` shows it (its task, id, start and the first bytes of its body), the runs each process ended
  by handler (``inspect stats``), each process's prefetch; and what it steers: the ids revoked (the
  :data:`REVOKED_KEPT` latest), each handler's time limits, the processes the pool keeps.
* Since when each process holds an event waiting for its handler's limit (:mod:`amqp_events.celery.pool.turns`).

Each process writes its own slot only; the lost runs and the revoked ids are shared by all, under a lock.
"""

from __future__ import annotations

import ctypes
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
#: What ``inspect active`` shows of a run: its task, id, exchange and routing key, and its body's first bytes.
SHOWN_BYTES = 2048
#: Revoked ids the processes know (the latest; Celery's worker keeps 50,000 for ``inspect revoked``).
REVOKED_KEPT = 4096


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
        self,
        slots: int,
        handlers: Sequence[str],
        queues: Sequence[str] = (),
        cancelled: Collection[str] = (),
        limits: Sequence[tuple[float, float]] = (),
    ) -> None:
        slots = max(1, slots)
        self.slots = slots
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
        # What remote control reads and steers.
        self.shown = [multiprocessing.RawArray("c", SHOWN_BYTES * RUNS_PER_SLOT) for _ in range(slots)]
        self.started_at = [multiprocessing.RawArray("d", RUNS_PER_SLOT) for _ in range(slots)]
        self.counts = multiprocessing.RawArray("q", slots * max(1, len(self.handlers)))
        self.prefetch = multiprocessing.RawArray("i", slots)
        self.arrived = multiprocessing.RawArray("b", slots)
        self.revoked = multiprocessing.RawArray("c", KEY_BYTES * REVOKED_KEPT)
        self.revoked_next = multiprocessing.RawValue("i", 0)
        #: Counts every revocation: a process reads the ids again when it changed.
        self.revoked_generation = multiprocessing.RawValue("i", 0)
        #: Per slot and handler: since when (wall clock) the slot holds an event over the handler's limit, 0: none.
        self.waiting_since = multiprocessing.RawArray("d", slots * max(1, len(self.handlers)))
        #: Per slot and handler: when that event asks again (0: it is asking now).
        self.asks_at = multiprocessing.RawArray("d", slots * max(1, len(self.handlers)))
        #: Per handler: when the last start its processes took in its first window stops being counted there.
        self.frees_at = multiprocessing.RawArray("d", max(1, len(self.handlers)))
        #: Each handler's (soft, hard) time limits in seconds, 0: none (``celery control time_limit`` sets them).
        given = dict(enumerate(limits))
        self.soft = multiprocessing.RawArray(
            "d", [given.get(index, (0.0, 0.0))[0] for index in range(len(handlers))] or [0.0]
        )
        self.hard = multiprocessing.RawArray(
            "d", [given.get(index, (0.0, 0.0))[1] for index in range(len(handlers))] or [0.0]
        )

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
        width = max(1, len(self.handlers))
        self.waiting_since[slot * width : (slot + 1) * width] = [0.0] * width  # what it held went back
        self.asks_at[slot * width : (slot + 1) * width] = [0.0] * width
        with self.lock:
            self.ended.value += 1
            keys = [key for key in _entries(self.runs[slot], RUNS_PER_SLOT) if key]
            self.runs[slot][:] = bytes(len(self.runs[slot]))
            self.started_at[slot][:] = [0.0] * RUNS_PER_SLOT
            for key in keys:
                at = self.lost_next.value
                _put(self.lost, at, key)
                self.lost_next.value = (at + 1) % LOST_KEPT

    def revoke(self, ids: Collection[str]) -> None:
        """Tell the processes these ids are revoked (the latest :data:`REVOKED_KEPT` are kept)."""
        with self.lock:
            for event_id in ids:
                at = self.revoked_next.value
                raw = event_id.encode("utf-8", "surrogatepass")[: KEY_BYTES - 1]
                _put(self.revoked, at, bytes([len(raw)]) + raw)  # its length first: an id may end in NUL
                self.revoked_next.value = (at + 1) % REVOKED_KEPT
            self.revoked_generation.value += 1

    def running(self, slot: int) -> list[tuple[int, float, bytes]]:
        """The runs the process of ``slot`` is in: ``(place, started at (epoch seconds), what it showed)``."""
        shown, started = self.shown[slot], self.started_at[slot]
        return [
            (place, started[place], shown[place * SHOWN_BYTES : (place + 1) * SHOWN_BYTES].rstrip(b"\0"))
            for place in range(RUNS_PER_SLOT)
            if started[place]
        ]

    def totals(self) -> dict[str, int]:
        """How many runs each handler ended, over every process (those of processes that ended included)."""
        width = max(1, len(self.handlers))
        return {
            handler: sum(self.counts[slot * width + index] for slot in range(self.slots))
            for index, handler in enumerate(self.handlers)
        }

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

    def revoked_ids(self) -> set[str]:
        """The ids revoked (read again only when :attr:`revoked_generation` changed: see :class:`Revoked`)."""
        with self.lock:
            raw = bytes(self.revoked)
        entries = (raw[at * KEY_BYTES : (at + 1) * KEY_BYTES] for at in range(REVOKED_KEPT))
        return {entry[1 : 1 + entry[0]].decode("utf-8", "surrogatepass") for entry in entries if entry[0]}

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

    def started(self, key: bytes, shown: bytes = b"") -> int | None:
        """A run began: its place in the slot (``None``: the slot is full); ``shown``: what ``inspect active``
        shows of it."""
        shared, slot = self.shared, self.slot
        shared.ran[slot] = 1
        with shared.lock:
            free = _find(shared.runs[slot], b"")  # an empty entry
            if free is not None:
                _put(shared.runs[slot], free, key)
                _write(shared.shown[slot], free * SHOWN_BYTES, shown[:SHOWN_BYTES].ljust(SHOWN_BYTES, b"\0"))
                shared.started_at[slot][free] = time.time()
            return free

    def ended(self, place: int | None, handler: int = -1) -> None:
        """A run ended (``handler``: its handler's index, counted)."""
        shared, slot = self.shared, self.slot
        if handler >= 0:  # this process alone writes its slot's counts
            shared.counts[slot * max(1, len(shared.handlers)) + handler] += 1
        if place is not None:
            with shared.lock:
                _put(shared.runs[slot], place, b"")
                shared.started_at[slot][place] = 0.0

    def limits_of(self, handler: int) -> tuple[float, float]:
        """``(soft, hard)`` time limits of the handler of index ``handler`` now (0: none)."""
        if handler < 0:
            return 0.0, 0.0
        return self.shared.soft[handler], self.shared.hard[handler]

    def limit(self, index: int, seconds: float) -> int:
        """A run of the handler of index ``index`` must end within ``seconds``; returns the token that ends it."""
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


class Revoked:
    """The revoked ids as a process sees them: a set read again from shared memory when a revocation came."""

    def __init__(self, shared: Shared) -> None:
        self.shared, self.generation, self.ids = shared, -1, frozenset[str]()

    def __contains__(self, event_id: object) -> bool:
        generation = self.shared.revoked_generation.value
        if generation != self.generation:
            self.ids, self.generation = frozenset(self.shared.revoked_ids()), generation
        return event_id in self.ids


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
    _write(array, index * KEY_BYTES, key.ljust(KEY_BYTES, b"\0"))


def _write(array: Any, offset: int, data: bytes) -> None:
    """``data`` into ``array`` at ``offset``: one copy (a ctypes slice assignment copies byte by byte: 2 KiB took
    47 microseconds, this half of one)."""
    ctypes.memmove(ctypes.addressof(array) + offset, data, len(data))
