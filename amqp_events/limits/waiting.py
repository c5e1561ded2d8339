"""What waits for its limit in one worker process, and for how long, and how a limited handler's queue is consumed:
pure bookkeeping, no I/O.

An event over its limit is held by the worker that took it (:class:`~amqp_events.core.outcome.Hold`: unacked; its
queue's consumer has a prefetch of the runs the process makes at once, so the queue gives the process no more of it
meanwhile) and tried again when a start or a place is likely free: it waits in its queue, in the queue's order, not
on the delay ladder. The events of one key (of one bucket of keys) wait in a line, each behind the one taken before
it, so that they start in the order they came, while other keys' events go on past them.

Bounds: a process holds at most :data:`HELD_PER_HANDLER` events of a handler, each at most :data:`LONGEST_HOLD`
seconds; a keyed event whose key's window frees only after :data:`KEYED_HOLD_SPACING` seconds or more is not held.
Past a bound an event waits on the service's own delay ladder instead (so one key cannot stop the others' events for
long, nor RabbitMQ close a channel whose delivery stays unacknowledged).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from amqp_events.core.context import ServiceContext
from amqp_events.limits.options import limits_of

#: Events of one handler one process holds at once (a keyed limit's queue gives that many more than the runs at once).
HELD_PER_HANDLER = 32
#: Seconds an event is held at most before it waits on the ladder instead (RabbitMQ closes a channel whose delivery
#: stays unacknowledged for its consumer_timeout, 30 minutes by default).
LONGEST_HOLD = 600.0
#: A keyed event is held only if its key's window gives a start at least this often (seconds between starts):
#: the other keys' events wait behind what the queue has given the process.
KEYED_HOLD_SPACING = 60.0
#: How often, in spacings of its window, an event refused by another process's start asks again.
ASKS_PER_SPACING = 10
#: The shortest and longest waits between two asks (seconds).
SHORTEST_ASK, LONGEST_ASK = 0.01, 60.0
#: Seconds past its time to ask after which an event first in its line is taken for gone (its process lost it
#: without a word): those behind it, in this process and the others, stop waiting for it.
GONE_AFTER = 10.0


def gone(asks_at: float, now: float) -> bool:
    """Has the event that was to ask again at ``asks_at`` (0: it is asking now) not come back?"""
    return 0.0 < asks_at < now - GONE_AFTER


class Peers(Protocol):
    """The other processes of this worker that hold events of a limit without a key (the consuming pool's: each
    process of it consumes): the one that waited longest asks first, so that one worker starts a backlog in the
    order it was fired."""

    def holding(self, handler: str, since: float | None, asks_at: float = 0.0) -> None:
        """This process holds an event of ``handler`` since ``since`` (wall clock; ``None``: none now), which asks
        again at ``asks_at`` (0: now)."""

    def earlier(self, handler: str, since: float, now: float) -> bool:
        """Does another process hold one since before ``since`` (and not :func:`gone`)?"""

    def started(self, handler: str, frees_at: float) -> None:
        """This process took a start of ``handler`` in its first window, counted there until ``frees_at``."""

    def frees_at(self, handler: str) -> float:
        """When the last start any process of the worker took in ``handler``'s first window stops being counted."""


@dataclass
class Line:
    """The events of one handler (and one bucket of keys) waiting here, first come first: each from when it arrived
    (before anything is asked of the broker, so that the first to arrive is first however long its first ask
    takes)."""

    ids: deque[str] = field(default_factory=deque)
    #: When each arrived (wall clock).
    since: dict[str, float] = field(default_factory=dict)
    #: Those held at least once.
    held: set[str] = field(default_factory=set)
    #: When the first asks again: those behind it look a moment later.
    asks_at: float = 0.0


class Waiting:
    """The lines of one worker process, by handler and bucket (``""``: a limit without a key); thread-safe (a
    threads pool's runs share it)."""

    #: The other processes of the worker, where they hold events too (set where a pool's process starts).
    peers: ClassVar[Peers | None] = None

    def __init__(self) -> None:
        self.lines: dict[tuple[str, str], Line] = {}
        #: When this process's last start in a window stops being counted there (wall clock), by window.
        self.frees_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def arrive(self, handler: str, bucket: str, event: str, now: float) -> bool:
        """``event`` is to start or wait: it joins its line (if not in it yet). May it try to start now: it is first
        in its line and, of a limit without a key, no other process of the worker has one waiting since earlier?"""
        with self._lock:
            line = self.lines.setdefault((handler, bucket), Line())
            if event not in line.since:
                line.ids.append(event)
                line.since[event] = now
                if bucket == "" and len(line.ids) == 1 and self.peers is not None:
                    self.peers.holding(handler, now)
            first = line.ids[0]
            if first != event and first in line.held and gone(line.asks_at, now):
                self._remove(handler, bucket, first)
            if line.ids[0] != event:
                return False
            since = line.since[event]
        return bucket != "" or self.peers is None or not self.peers.earlier(handler, since, now)

    def may_hold(self, handler: str, bucket: str, event: str, now: float) -> bool:
        """May this process hold ``event`` (again): its handler's room for held events, and not held too long?"""
        with self._lock:
            line = self.lines.get((handler, bucket))
            if line is not None and event in line.held:
                return now - line.since[event] < LONGEST_HOLD
            held = sum(len(other.held) for (name, _), other in self.lines.items() if name == handler)
            return held < HELD_PER_HANDLER

    def hold(self, handler: str, bucket: str, event: str, now: float, seconds: float) -> float:
        """Hold ``event`` (which arrived), to ask again in ``seconds`` if it is first in its line; returns when it
        asks again (one behind: a moment after the first, which may start by then)."""
        with self._lock:
            line = self.lines.setdefault((handler, bucket), Line())
            if event not in line.since:  # pragma: no cover (arrive() came first)
                line.ids.append(event)
                line.since[event] = now
            line.held.add(event)
            if line.ids[0] == event:
                line.asks_at = now + seconds
                if bucket == "" and self.peers is not None:
                    self.peers.holding(handler, line.since[event], line.asks_at)
                return seconds
            return max(SHORTEST_ASK, line.asks_at - now + 0.002)

    def leave(self, handler: str, event: str) -> None:
        """``event`` starts, or waits elsewhere, or its attempt ended otherwise (a breaker took it, say): it leaves
        its line."""
        with self._lock:
            found = [key for key, line in self.lines.items() if key[0] == handler and event in line.since]
            if found:
                self._remove(handler, found[0][1], event)

    def _remove(self, handler: str, bucket: str, event: str) -> None:
        line = self.lines[(handler, bucket)]
        first = line.ids[0] == event
        line.ids.remove(event)
        del line.since[event]
        line.held.discard(event)
        if first:
            line.asks_at = 0.0
        if not line.ids:
            del self.lines[(handler, bucket)]
        if first and bucket == "" and self.peers is not None:
            self.peers.holding(handler, line.since[line.ids[0]] if line.ids else None)

    def started(self, window: str, lasts: float, now: float, handler: str = "") -> None:
        """This process took a start in ``window`` (``handler``'s first, without a key: the worker's other
        processes are told), counted there ``lasts`` seconds."""
        with self._lock:
            self.frees_at[window] = now + lasts
            if len(self.frees_at) > 4 * HELD_PER_HANDLER * 1024:  # keyed windows come and go: forget the old ones
                self.frees_at = {name: at for name, at in self.frees_at.items() if at > now}
        if handler and self.peers is not None:
            self.peers.started(handler, now + lasts)

    def until_free(self, window: str, spacing: float, now: float, handler: str = "") -> float:
        """Seconds until ``window`` is asked again: exactly when the last start there of this process (of this
        worker, for ``handler``'s first window without a key) stops being counted, else a tenth of the window's
        spacing (another worker's start: when it ends, this one cannot know; those waiting ask often enough that
        the window is seldom left unused)."""
        frees_at = self.frees_at.get(window, 0.0)
        if handler and self.peers is not None:
            frees_at = max(frees_at, self.peers.frees_at(handler))
        if frees_at > now:
            return frees_at - now + 0.001
        return min(LONGEST_ASK, max(SHORTEST_ASK, spacing / ASKS_PER_SPACING))


def limited_prefetch(keyed: bool | None, runs_at_once: int) -> int | None:
    """The prefetch of a consumer of a limited handler's queue (``keyed``: its limit is per key; ``None``: it has no
    limit, the consumer's prefetch is the worker's): the runs it makes at once, so that no event waits in it unrun,
    and for a keyed limit :data:`HELD_PER_HANDLER` more, for the other keys' events to go on past those held."""
    if keyed is None:
        return None
    return max(1, runs_at_once) + (HELD_PER_HANDLER if keyed else 0)


def keyed_limit(context: ServiceContext, queue: str) -> bool | None:
    """Is the limit of a handler taking its events from ``queue`` per key (``None``: none of them has one)? A queue
    that handlers without a limit share (``per_service``) is consumed as the others are."""
    handlers = context.takers(queue)
    limits = [limits_of(handler) for handler in handlers]
    if not handlers or not all(limits):
        return None
    return any(found.concurrency_key is not None or found.rate_key is not None for found in limits)
