"""Flow control's counts on RabbitMQ (:mod:`amqp_events.limits`): leases and windows of starts.

A *lease* is an exclusive queue of a connection this process holds for the purpose: declaring one another
connection holds fails (``RESOURCE_LOCKED``), so at most one run anywhere holds each, and RabbitMQ deletes it
when the connection ends, so a process killed mid-run gives its lease back as soon as the broker sees the
connection go. The connection has no AMQP heartbeats: a run longer than two of them would otherwise lose its lease
while it still runs (TCP keepalive finds a dead peer instead).

A *window* is a durable classic queue that holds at most ``count`` bytes of messages, each for ``seconds``, and
refuses more: a start is a byte of a message it confirmed, and a nack says the window is full. One queue process
takes them one at a time, so any number of workers share one limit exactly (a quorum queue's limit lets one more
in: it learns it is full after the message that fills it past it); a crash counts what started, and a broker
restart keeps the count (the messages are persistent). While the node holding a window is down, its handler's
starts cannot be counted: they wait as starts over the limit do (:class:`~amqp_events.errors.LimitUnavailable`),
never run uncounted.

A process that starts runs of a handler quickly takes several starts in one message (one round trip) and uses them
in the moment after (:class:`~amqp_events.topology.limits.Window`): twice as many the next time when it used them
all, half as many when some went unused, one when the window is nearly full.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from amqp import Message
from amqp.exceptions import ConnectionError as AMQPConnectionError
from amqp.exceptions import MessageNacked, NotFound, PreconditionFailed, ResourceLocked
from kombu import Connection, Queue
from kombu.exceptions import OperationalError

from amqp_events.errors import LimitUnavailable
from amqp_events.topology.limits import START, Window, redeclare_every
from amqp_events.transport.limit_settings import Following

#: The connection lost (its node down, the network cut) or not made: the counts cannot be reached now.
LOST = (OSError, AMQPConnectionError, OperationalError)
#: Seconds a process keeps a lease after its run ended, for its next run of the same handler (or key) to take
#: without asking the broker (declaring and deleting an exclusive queue takes about 4 ms); then it is given back.
KEEP_IDLE = 0.05
#: How many windows a process remembers declaring (a key's window is declared again past this).
REMEMBERED_WINDOWS = 10_000


class Ahead:
    """The starts of one window this process took ahead of its runs and has not used yet, and how many it takes
    next time. Pure: the caller counts them in the window (:meth:`Leases.admit`)."""

    def __init__(self, most: int, seconds: float) -> None:
        self.most, self.seconds = most, seconds
        self.left = 0
        self.until = 0.0  # when those left may no longer be used (monotonic)
        self.asking = 1

    def use(self, now: float) -> bool:
        """Use one of the starts left, if they are still in time; else learn from the last ones taken."""
        if self.left and now < self.until:
            self.left -= 1
            return True
        if not self.left and now < self.until:  # all used in time: take more
            self.asking = min(self.most, self.asking * 2)
        elif self.left:  # some went unused
            self.asking = max(1, self.asking // 2)
        self.left = 0
        return False

    def took(self, asked: int, taken: int, at: float) -> None:
        """``taken`` of the ``asked`` starts were counted (asked for at ``at``), one of them for the run now."""
        self.left, self.until = max(0, taken - 1), at + self.seconds if taken else 0.0
        if taken < asked:  # the window is (nearly) full: one at a time (a refusal is no run of starts used up)
            self.asking = 1


class Leases:
    """Leases and windows on one connection of this process's own (opened on first use, and again in a forked
    child or after the connection failed); thread-safe."""

    def __init__(self, connect: Callable[[], Connection], timeout: float = 10.0) -> None:
        self._connect = connect
        self.timeout = timeout
        self._lock = threading.Lock()
        self._pid = 0
        self._connection: Connection | None = None
        self._leasing: Any = None
        self._counting: Any = None
        #: The leases this process holds: its connection would declare one of them again without a refusal.
        self._held: set[str] = set()
        #: Each held lease's names (those it was one of), for its next :meth:`hold` of them.
        self._taken_from: dict[str, Sequence[str]] = {}
        #: Of the held leases, those no run holds now: lease -> (when its run ended, the names it was taken from).
        self._idle: dict[str, tuple[float, Sequence[str]]] = {}
        self._sweeping = 0  # the pid whose thread gives idle leases back
        #: Window name -> when this connection last declared it.
        self._declared: dict[str, float] = {}
        #: Window name -> the starts taken ahead of their runs.
        self._ahead: dict[str, Ahead] = {}
        #: The broker returned the message just published (no queue took it).
        self._returned = False
        #: The streams of limits set at run time this connection follows.
        self._following: dict[str, Following] = {}

    def hold(self, names: Sequence[str]) -> str | None:
        """Take one of ``names`` no connection holds, trying them from a random one on (workers asking at once
        try different ones first); ``None`` when each is held."""
        start = random.randrange(len(names)) if names else 0
        with self._lock, self._failing_resets():
            connection = self._open()
            for name, (_, taken_from) in self._idle.items():  # kept from the last run: no broker work
                if taken_from is names or taken_from == names:
                    del self._idle[name]
                    return name
            for name in [*names[start:], *names[:start]]:
                if name in self._held:  # another run of this process (a thread, a coroutine) holds it
                    continue
                channel = self._leasing = self._leasing or connection.channel()
                try:
                    channel.queue_declare(
                        name, durable=False, exclusive=True, auto_delete=False, arguments={"x-queue-type": "classic"}
                    )
                except ResourceLocked:  # held by another connection; the broker closed this channel
                    self._leasing = None
                    continue
                self._held.add(name)
                self._taken_from[name] = names
                return name
            return None

    def release(self, name: str) -> None:
        """Give the lease ``name`` back (a connection that failed meanwhile gave it back already); this process keeps
        it :data:`KEEP_IDLE` seconds for its next :meth:`hold` of the same names."""
        with self._lock:
            names = self._taken_from.get(name)
            if names is None or self._connection is None or self._pid != os.getpid():
                self._held.discard(name)
                return
            self._idle[name] = (time.monotonic(), names)
            if self._sweeping != self._pid:  # the thread of this process (a forked child has none)
                self._sweeping = self._pid
                threading.Thread(target=self._sweep, name="amqp-events-leases", daemon=True).start()

    def _sweep(self) -> None:
        """Give back the leases kept idle past :data:`KEEP_IDLE`, until this process's connection goes."""
        while True:
            time.sleep(KEEP_IDLE / 2)
            with self._lock:
                if self._sweeping != os.getpid():
                    return
                now = time.monotonic()
                expired = [name for name, (ended, _) in self._idle.items() if now - ended >= KEEP_IDLE]
                try:
                    for name in expired:
                        del self._idle[name]
                        self._held.discard(name)
                        self._taken_from.pop(name, None)
                        self._leasing = self._leasing or self._open().channel()
                        self._leasing.queue_delete(name)
                except Exception:  # the connection failed: what it held went with it
                    self._reset()

    def admit(self, window: Window) -> bool:
        """Count a start in ``window``: ``False`` when it holds as many as it may; :class:`LimitUnavailable` when
        the window's node cannot be reached (nothing is counted)."""
        with self._lock, self._failing_resets():
            try:
                return self._admit(window)
            except NotFound as exc:  # its node is down: the broker closed the channel, not the connection
                unavailable = f"the window {window.queue.name!r} cannot be reached: {exc}"
            except PreconditionFailed as exc:  # declared by another version, or by hand: it must be deleted
                vhost = getattr(self._connection, "virtual_host", "/")
                unavailable = (
                    f"the window {window.queue.name!r} exists with other arguments than this version gives it "
                    f"({exc}); its starts are counted for a window's time only, so delete it and the workers declare "
                    f"it anew: rabbitmqctl delete_queue -p {vhost} {window.queue.name}"
                )
            self._counting = None  # the broker closed the channel, not the connection
            self._declared.pop(window.queue.name, None)
        raise LimitUnavailable(unavailable)

    def _admit(self, window: Window) -> bool:
        self._open()  # first: a forked child forgets its parent's starts
        ahead = self._ahead.get(window.queue.name)
        now = time.monotonic()
        if ahead is not None and ahead.use(now):
            return True
        asking = ahead.asking if ahead is not None else 1
        taken = asking if self._count(window.queue, asking) else 0
        if not taken and asking > 1:  # the window is nearly full: one may still fit
            taken = 1 if self._count(window.queue, 1) else 0
        if window.most_ahead > 1:
            if ahead is None:
                if len(self._ahead) >= REMEMBERED_WINDOWS:
                    self._ahead.clear()
                ahead = self._ahead[window.queue.name] = Ahead(window.most_ahead, window.ahead_seconds)
            ahead.took(asking, taken, now)
        return taken > 0

    def _count(self, window: Queue, starts: int) -> bool:
        """Count ``starts`` starts in ``window`` at once (a message of as many bytes): ``False`` when they do not
        fit."""
        if self._counting is None:
            self._counting = self._open().channel()
            self._counting.events["basic_return"].add(self._on_return)
        for _ in range(2):  # a window that went (deleted, unbound) is declared again, once
            now = time.monotonic()
            declared = self._declared.get(window.name)
            if declared is None or now - declared >= redeclare_every(window):
                window(self._counting).declare()
                if len(self._declared) >= REMEMBERED_WINDOWS:
                    self._declared.clear()
                self._declared[window.name] = now
            self._returned = False
            try:
                self._counting.basic_publish_confirm(
                    Message(START * starts, delivery_mode=2),
                    window.exchange.name,
                    window.routing_key,
                    mandatory=True,
                    confirm_timeout=self.timeout,
                )
            except MessageNacked:
                return False
            if not self._returned:  # a start is counted only where a window took it
                return True
            self._declared.pop(window.name, None)
        raise NotFound(f"the window {window.name!r} takes no message, even declared again")

    def limit_table(self, stream: str) -> bytes | None:
        """The last table of limits written to ``stream``, as this connection has read it."""
        with self._lock, self._failing_resets():
            connection = self._open()
            following = self._following.get(stream)
            if following is None:
                following = self._following[stream] = Following(connection, stream)
            return following.current()

    def _on_return(self, *returned: Any) -> None:
        self._returned = True

    def close(self) -> None:
        with self._lock:
            self._reset()

    def _open(self) -> Connection:
        if self._connection is None or self._pid != os.getpid():
            self._connection = None  # a forked child's are its parent's
            self._forget()
            connection = self._connect()
            connection.connect()
            self._connection, self._pid = connection, os.getpid()
        return self._connection

    def _reset(self) -> None:
        connection, self._connection = self._connection, None
        self._forget()
        if connection is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):  # already gone: what it held went with it
                connection.close()

    def _forget(self) -> None:
        """Drop what belonged to a connection gone: its channels, its declarations, its leases (its end gave them
        back)."""
        self._leasing = self._counting = None
        self._ahead.clear()
        self._following.clear()
        self._idle.clear()
        self._taken_from.clear()
        self._declared.clear()
        self._held.clear()

    @contextlib.contextmanager
    def _failing_resets(self) -> Iterator[None]:
        """A failure other than a refusal drops the connection (what it held went with it) and raises; the
        connection lost or not made is :class:`LimitUnavailable` (nothing was counted: the event waits)."""
        try:
            yield
        except LOST as exc:
            self._reset()
            raise LimitUnavailable(f"flow control's connection to the broker failed: {exc!r}") from exc
        except BaseException:
            self._reset()
            raise
