"""Acks sent together: one ``basic.ack`` with ``multiple`` for a run of settled deliveries, not one per message.

A channel numbers its deliveries 1, 2, 3, ... (again from 1 when it is reopened); an ack with ``multiple`` settles every
outstanding delivery up to its tag. :class:`HeldAcks` holds the acks a consumer's channel is given in a fast run (each
within :data:`HOLD_GAP` of the one before; at any pace where a pool's processes run the handlers) while more deliveries
wait to be read or runs of the pool (whose results wake the event loop) may end in a moment, and sends them once the
worker is about to wait with neither (its event loop's tick before each poll), once ``limit`` are held, or once the
oldest is :data:`MAX_HOLD` old (a timer of the event loop sees to it while the loop waits). An ack with ``multiple`` is
sent only up to a tag below which every delivery of the channel is settled here (acked, rejected or requeued), so it
never settles a message still running; the others are sent alone. Rejects and requeues go out at once, and so does an
ack given in another thread than the consumer's, or after a slower handler. With the solo pool the held acks of a fast
run may wait for the run of the message after them (a duplicate, should the worker die meanwhile, as with any ack not
yet sent). The ack of a message whose copy was published in its place (a retry, the archive) must not wait so, or the
message and its copy would both come back: its delivery is marked (:meth:`HeldAcks.never_hold`, or
:func:`ack_at_once` from a kombu message), and its ack goes out as given, with what is held.

Upstream (RabbitMQ 3.10-4.x): an ack whose tag is not outstanding closes the channel (PRECONDITION_FAILED
"unknown delivery tag"), with ``multiple`` too when no later delivery is outstanding: the tag sent is always a
held one, never sent before.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: Settled deliveries kept above one that is not (an ordered lane's, a long coroutine's, or one this channel took
#: before the consumer began, as Celery's mingle does without acks): past this many, acks are no longer held on
#: that channel (memory stays bounded if a delivery is never settled here).
MAX_TRACKED = 4096
#: Seconds between two acks within which the second is held: a run of fast handlers. After a slower one (whose
#: ack costs little beside it) the ack goes out at once. Where handlers run in other processes (prefork), the
#: consumer's process is the one that pays for each ack frame whatever the handlers' pace: there the gap is
#: :data:`MAX_HOLD`.
HOLD_GAP = 0.002
#: Seconds an ack is held at most while deliveries keep arriving (on this or another channel of the connection).
MAX_HOLD = 0.05


class AckWindow:
    """Which deliveries of one channel are settled, and the acks held: bookkeeping only, no I/O."""

    __slots__ = ("held", "settled_above", "settled_through", "tracking")

    def __init__(self) -> None:
        self.settled_through = 0  # every delivery up to this tag is settled
        self.settled_above: set[int] = set()
        self.held: list[int] = []
        self.tracking = True

    def settle(self, tag: int, multiple: bool = False) -> None:
        """Delivery ``tag`` is settled (with ``multiple``: every delivery up to it)."""
        if multiple and tag > self.settled_through:
            self.settled_above = {above for above in self.settled_above if above > tag}
            self.settled_through = tag
        elif tag == self.settled_through + 1:
            self.settled_through = tag
        elif tag > self.settled_through:
            self.settled_above.add(tag)
            if len(self.settled_above) > MAX_TRACKED:
                self.tracking = False
                self.settled_above.clear()
        while self.settled_above and self.settled_through + 1 in self.settled_above:
            self.settled_through += 1
            self.settled_above.discard(self.settled_through)

    def hold(self, tag: int) -> None:
        """An ack for ``tag``, to be sent later."""
        self.settle(tag)
        self.held.append(tag)

    def release(self) -> tuple[int | None, list[int]]:
        """The acks to send now: the tag of one ack with ``multiple`` (``None``: none), and the tags to ack alone."""
        held, self.held = self.held, []
        if not self.tracking:
            return None, held
        covered = [tag for tag in held if tag <= self.settled_through]
        alone = [tag for tag in held if tag > self.settled_through]
        if len(covered) == 1:
            return None, covered + alone
        return (max(covered) if covered else None), alone


class HeldAcks:
    """Holds the acks of ``channel`` (a py-amqp channel, through which kombu's messages settle) and sends them
    together (see the module's text); installed on the channel until :meth:`uninstall`."""

    def __init__(
        self,
        channel: Any,
        limit: Callable[[], int],
        call_later: Callable[[float, Callable[[], None]], Any],
        hold_gap: float | None = None,
    ) -> None:
        self.channel, self.limit, self.call_later = channel, limit, call_later
        self.hold_gap = HOLD_GAP if hold_gap is None else hold_gap
        self.timer: Any = None  # the event loop's timer that sends what is still held after MAX_HOLD
        self.window = AckWindow()
        # Reentrant: a signal handler of the consumer's thread (a cold shutdown) may ack while it sends.
        self.lock = threading.RLock()
        self.thread = threading.get_ident()
        self.holding = True
        self.marked: set[int] = set()  # deliveries whose ack is never held
        self.last_ack = self.oldest_held = 0.0
        self._ack, self._reject, self._revive = channel.basic_ack, channel.basic_reject, channel._do_revive
        channel.basic_ack, channel.basic_reject, channel._do_revive = self.ack, self.reject, self._reopened
        channel.held_acks = self  # for :func:`ack_at_once`

    def ack(self, delivery_tag: int, multiple: bool = False, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            marked = self._unmark(delivery_tag)
            if multiple or not (self.holding and self.window.tracking) or threading.get_ident() != self.thread:
                self.window.settle(delivery_tag, multiple)
                return self._ack(delivery_tag, multiple, *args, **kwargs)
            now = time.monotonic()
            fast, self.last_ack = now - self.last_ack <= self.hold_gap, now
            if not self.window.held:
                self.oldest_held = now
            self.window.hold(delivery_tag)
            if marked or not fast or len(self.window.held) >= max(1, self.limit()) or now - self.oldest_held > MAX_HOLD:
                self._send()
            return None

    def reject(self, delivery_tag: int, requeue: bool = True, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.window.settle(delivery_tag)
            self._unmark(delivery_tag)
            return self._reject(delivery_tag, requeue, *args, **kwargs)

    def never_hold(self, delivery_tag: int) -> None:
        """The ack of ``delivery_tag`` goes out as it is given, with what is held: a copy of its message took (or
        may take) its place."""
        with self.lock:
            self.marked.add(delivery_tag)
            if len(self.marked) > MAX_TRACKED:  # marked deliveries never settled here: hold nothing from now on
                logger.warning("%d deliveries marked and not settled: acks are no longer held", len(self.marked))
                self.holding = False
                self.marked.clear()

    def send_if_waiting(self, running: int = 0) -> None:
        """Send the held acks unless more deliveries wait to be read, or ``running`` runs (a pool's, whose results
        wake the loop) may end in a moment: then a later tick sends them, or a timer, within :data:`MAX_HOLD`."""
        if not self.window.held:
            return
        if time.monotonic() - self.oldest_held > MAX_HOLD or not (running or self._more_to_read()):
            self.send()
            return
        if self.timer is None:  # the loop may then wait in its poll: it must not keep them longer
            self.timer = self.call_later(MAX_HOLD, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        self.send()

    def send(self) -> None:
        """Send the held acks now. If the channel is gone, so are they: the broker has those messages back."""
        with self.lock:
            try:
                self._send()
            except Exception as exc:
                logger.warning("could not send the held acks (%s): the broker gets them back with the channel", exc)

    def uninstall(self) -> None:
        """Send what is held, and give the channel its own ack and reject back."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.send()
        with self.lock:
            self.holding = False  # a caller that found this ack before it was taken off sends at once
        for name in ("basic_ack", "basic_reject", "_do_revive", "held_acks"):
            vars(self.channel).pop(name, None)

    def _reopened(self) -> Any:
        """Upstream (py-amqp): a channel the broker closed is opened again as the same object, its deliveries
        numbered from 1 again; what it held went back to the queues with the old one. A message taken before may
        still be acked with its old tag, which the new count may give another: from now on every ack goes out
        at once, as it is given."""
        with self.lock:
            self.window = AckWindow()
            self.holding = False
            self.marked.clear()
        return self._revive()

    def _send(self) -> None:
        multiple, alone = self.window.release()
        if multiple is not None:
            self._ack(multiple, True)
        for tag in alone:
            self._ack(tag, False)

    def _unmark(self, delivery_tag: int) -> bool:
        """Was ``delivery_tag`` marked (it no longer is)?"""
        if delivery_tag not in self.marked:
            return False
        self.marked.discard(delivery_tag)
        return True

    def _more_to_read(self) -> bool:
        sock = getattr(self.channel.connection, "sock", None)
        if sock is None:
            return False
        try:
            return bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):
            return False


def ack_at_once(message: Any) -> None:
    """``message``'s ack (kombu's message) goes out as it is given, not held: a copy of it took its place."""
    held = getattr(message.channel, "held_acks", None)
    if held is not None:
        held.never_hold(message.delivery_tag)
