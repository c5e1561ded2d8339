"""The ordered runner: a service's messages of ordered handlers, one at a time per key, in the order they came.

Whatever takes the messages (a Celery worker's partition consumers, the
in-process mode of :mod:`amqp_events.testing`) gives each to
:meth:`OrderedRunner.take` as a :class:`Pending`: its key, its delivery, how to
run its handler and how to settle the original. The runner keeps them
in lanes by key (:class:`~amqp_events.ordering.lanes.Lanes`), admits each
through its partition's parked keys (:class:`~amqp_events.ordering.parking.Parking`),
runs it, and holds a retry itself: the original stays unacked on the broker
and runs again after its delay, the later messages of its key behind it.
Where runs and held retries happen is the :class:`Executor`'s business.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from amqp_events.core.context import ServiceContext
from amqp_events.core.delivery import Answer, Delivery, Settler
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Outcome, Redeliver, RejectedByHandler, SendToArchive, answer_of
from amqp_events.ordering.lanes import Lanes
from amqp_events.ordering.parking import Parking
from amqp_events.ordering.sequences import Action
from amqp_events.wire.message import StoredMessage

logger = logging.getLogger(__name__)

#: Longest wait of a held retry, in seconds: RabbitMQ takes back a message unacked for 30 minutes
#: (``consumer_timeout``), so longer backoffs wait this long.
LONGEST_HOLD = 15 * 60.0
#: Seconds before a message whose outcome could not be carried out (the broker went away) runs again.
SETTLE_AGAIN_AFTER = 5.0


class Executor(Protocol):
    """Where the runner's work happens: runs now (or soon), and calls after a delay."""

    def submit(self, call: Callable[[], None]) -> None:
        """Run ``call``: in this thread, or in one of the executor's."""

    def call_after(self, seconds: float, call: Callable[[], None], tag: str) -> None:
        """Run ``call`` after ``seconds``; ``tag`` (a partition) cancels it with the others of its tag."""

    def cancel(self, tag: str | None = None) -> None:
        """Cancel the calls of ``tag`` (every one when ``None``) not made yet."""

    def stop(self) -> None:
        """No more calls: the pending ones are dropped, the running ones finish."""


@dataclass(slots=True)
class Pending:
    """A message of an ordered handler in the runner: running, waiting behind its key, or waiting for its retry.
    Only the runner changes it (its turn when taken, its action when first run, its delivery for a retry)."""

    key: str
    handler: Handler
    delivery: Delivery
    #: The original as it sits on the broker (parking keeps a copy of it).
    stored: StoredMessage
    #: Runs the handler on a delivery: the outcome settled, or ``None`` (the runtime took it: Celery's ``Ignore``).
    run: Callable[[Delivery], Outcome | RejectedByHandler | None]
    #: How the original is settled on the broker.
    settler: Settler
    #: Its partition's turn with this runner (:meth:`OrderedRunner.forget` ends it); set by :meth:`OrderedRunner.take`.
    turn: int = -1
    #: What its key's parked sequence (if any) made of it; ``None`` until it was first taken up.
    action: Action | None = None

    @property
    def partition(self) -> str:
        return self.delivery.queue


class OrderedRunner:
    """The messages of ordered handlers one consumer (or the in-process mode) took, in lanes by key."""

    def __init__(self, context: Callable[[], ServiceContext], executor: Executor) -> None:
        self.context, self.executor = context, executor
        #: Per partition (a key is in one partition).
        self.lanes: dict[str, Lanes[Pending]] = defaultdict(Lanes)
        #: Each partition's turn: a message of an ended turn went back to the broker with its channel.
        self.turns: dict[str, int] = defaultdict(int)
        #: Partitions being handed over: their messages not yet started wait, to go back to the broker.
        self.paused: set[str] = set()
        self.running: dict[str, int] = defaultdict(int)
        self.lock = threading.Lock()
        self.parking = Parking(context)
        self.stopped = False

    def take(self, held: Pending) -> None:
        """A message arrived: run it now, or after the one of its key before it."""
        held.turn = self.turns[held.partition]
        if self.lanes[held.partition].offer(held.key, held):
            self.submit(held)

    # -- a partition's turn, the connection, the worker ------------------------------------------------

    def pause(self, partition: str) -> None:
        """Start no more messages of ``partition`` (it is being handed over to another worker)."""
        with self.lock:
            self.paused.add(partition)

    def idle(self, partition: str) -> bool:
        """Does no message of ``partition`` run now?"""
        with self.lock:
            return not self.running[partition]

    def forget(self, partition: str) -> None:
        """``partition``'s channel was closed: what it held went back to the broker, in order. Forget it."""
        with self.lock:
            self.turns[partition] += 1
            self.lanes.pop(partition, None)
            self.paused.discard(partition)
        self.executor.cancel(partition)
        self.parking.forget(partition)

    def reconnected(self) -> None:
        """The connection was lost: everything held went back to the broker, in order, and comes again.
        Forget it all (a run in progress finishes, but its ack is lost with the connection)."""
        with self.lock:
            for partition in self.turns:
                self.turns[partition] += 1
            self.lanes.clear()
        self.parking = Parking(self.context)
        self.executor.cancel()

    def stop(self) -> None:
        """The worker stops: held retries are dropped (their messages go back to the broker, unacked)."""
        self.stopped = True
        self.executor.stop()

    # -- running -------------------------------------------------------------------------------------

    def submit(self, held: Pending) -> None:
        if not self.stopped:
            self.executor.submit(lambda: self.run(held))

    def run(self, held: Pending | None) -> None:
        """Run ``held``, then the next message of its key while its lane has one ready."""
        while held is not None and self.current(held):
            partition, key = held.partition, held.key
            with self.lock:
                if partition in self.paused:
                    return
                self.running[partition] += 1
            try:
                held = self.run_one(held)
            except Exception:  # a bug: say so (an executor's thread would swallow it), and leave the key's lane
                logger.exception("ordered handling of %s failed; its key waits until a reconnection", key)
                return
            finally:
                with self.lock:
                    self.running[partition] -= 1

    def current(self, held: Pending) -> bool:
        """Is ``held`` still this runner's (not gone with its partition or the connection)?"""
        return held.turn == self.turns[held.partition] and not self.stopped

    def run_one(self, held: Pending) -> Pending | None:
        """Run one message; returns the next one of its key to run now, if any."""
        parking, delivery = self.parking, held.delivery
        try:
            action = held.action
            if action is None:
                action = parking.admit(held.partition, held.key, delivery.event_id, delivery.headers)
                if not takes_part(action, parking, held):
                    return self.done(held, Answer.ACK_REPLACED if action is Action.PARK else Answer.ACK)
                held.action = action
            outcome = held.run(delivery)
            if isinstance(outcome, RejectedByHandler):  # it gives up its place
                held.settler.settle(answer_of(outcome))
                return self.lanes[held.partition].finish(held.key) if self.current(held) else None
            if isinstance(outcome, Redeliver):  # its retry: the later messages of its key wait behind it
                held.delivery = retried(delivery, outcome)
                self.later(min(float(outcome.delay), LONGEST_HOLD), held)
                return None
            archived = isinstance(outcome, SendToArchive)
            parking.ran(held.partition, held.key, delivery.event_id, action, archived, held.handler.parks)
        except Exception:  # the outcome could not be carried out (the broker went away): try again
            logger.exception("could not settle %s[%s]; running it again", held.handler.name, delivery.event_id)
            self.later(SETTLE_AGAIN_AFTER, held)
            return None
        return self.done(held, Answer.ACK_REPLACED if archived else Answer.ACK)

    def done(self, held: Pending, answer: Answer) -> Pending | None:
        """Ack ``held`` (:attr:`~Answer.ACK_REPLACED`: by its parked or archived copy); returns the next message of
        its key to run now, if any."""
        held.settler.settle(answer)
        return self.lanes[held.partition].finish(held.key) if self.current(held) else None

    def later(self, seconds: float, held: Pending) -> None:
        self.executor.call_after(seconds, lambda: self.submit(held), held.partition)


def takes_part(action: Action, parking: Parking, held: Pending) -> bool:
    """Does a message admitted with ``action`` run? If not, it is parked now, or was a release command."""
    if action is Action.PARK:
        parking.park(held.partition, held.key, held.stored)
    elif action is Action.RELEASE:
        parking.release(held.partition, held.key)
    elif action is Action.DROP:
        logger.info("key %r no longer waits for %s: release command dropped", held.key, held.delivery.event_id)
    return action not in (Action.PARK, Action.RELEASE, Action.DROP, Action.DONE)


def retried(held_delivery: Delivery, retry: Redeliver) -> Delivery:
    """The delivery a held retry runs with: the retry copy's headers and arguments."""
    copy = retry.copy
    return replace(held_delivery, headers=copy.headers, args=copy.body[0], kwargs=copy.body[1])
