"""How a worker runs the messages of ordered handlers (``ordered_by``): one at a time per key, whatever the pool.

The messages come from the service's partitions (:mod:`amqp_events.ordering`),
each consumed by one worker at a time. :class:`OrderedRunner`, one per
consumer, keeps them in lanes by key and runs them: in the consumer's own
thread with the solo pool, otherwise in a thread pool of the worker's main
process as large as the worker's concurrency (prefork children never run
them: a lane must know when its message is done). A retry is held here: the
original stays unacked on the broker and runs again after its delay.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/test_ordered.py).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from celery.concurrency.solo import TaskPool as SoloPool
from celery.exceptions import Reject

from amqp_events.celery.running import run_here
from amqp_events.core import handling
from amqp_events.core.delivery import Delivery
from amqp_events.core.outcome import Redeliver, SendToArchive
from amqp_events.core.settle import publish_routed
from amqp_events.errors import BadArguments
from amqp_events.ordering.lanes import Lanes
from amqp_events.ordering.parking import Parking
from amqp_events.ordering.sequences import Action
from amqp_events.ordering.timers import Timers
from amqp_events.topology import ordered_exchange_name
from amqp_events.topology.names import intake_queue_name, slot_of
from amqp_events.wire.message import EVENT_KEY, EVENT_SLOT, OutgoingMessage, Reason, StoredMessage, event_key
from amqp_events.wire.parking import RELEASED_BEHIND, RELEASED_LAST

logger = logging.getLogger(__name__)

#: Longest wait of a held retry, in seconds: RabbitMQ takes back a message unacked for 30 minutes
#: (``consumer_timeout``), so longer backoffs wait this long.
LONGEST_HOLD = 15 * 60.0
#: Seconds before a message whose outcome could not be carried out (the broker went away) runs again.
SETTLE_AGAIN_AFTER = 5.0


@dataclass(frozen=True)
class Held:
    """A message of an ordered handler in a worker: running, waiting behind its key, or waiting for its retry."""

    key: str
    #: The connection it came on (:attr:`OrderedRunner.generation`): after a reconnection it is gone.
    generation: int
    #: Its partition's turn with this worker (:meth:`OrderedRunner.forget` ends it).
    epoch: int
    task: Any
    message: Any
    ack: Callable[..., Any]
    reject: Callable[..., Any]
    delivery: Delivery
    #: What its key's parked sequence (if any) made of it; ``None`` until it was first taken up.
    action: Action | None = None

    @property
    def partition(self) -> str:
        return self.delivery.queue


class OrderedRunner:
    """A worker's messages of ordered handlers, in lanes by key (:class:`~amqp_events.ordering.lanes.Lanes`)."""

    def __init__(self, app: Any, consumer: Any) -> None:
        self.app, self.consumer = app, consumer
        #: Per partition (a key is in one partition).
        self.lanes: dict[str, Lanes[Held]] = defaultdict(Lanes)
        self.epochs: dict[str, int] = defaultdict(int)
        #: Partitions being handed over: their messages not yet started wait, to go back to the broker.
        self.paused: set[str] = set()
        self.running: dict[str, int] = defaultdict(int)
        self.lock = threading.Lock()
        self.parking = Parking(lambda: app.context)
        self.errors = consumer.connection_errors
        self.loop_thread = threading.get_ident()
        pool = consumer.pool
        self.executor = (
            None
            if isinstance(pool, SoloPool)
            else ThreadPoolExecutor(max_workers=max(1, pool.limit or 1), thread_name_prefix="amqp-events-ordered")
        )
        #: Held retries (and settlements tried again) waiting for their time.
        self.timers = Timers()
        self.generation = 0
        self.stopped = False

    @classmethod
    def of(cls, app: Any, consumer: Any) -> OrderedRunner:
        """The runner of ``consumer``, made on first use."""
        runner = getattr(consumer, "ordered_runner", None)
        if runner is None:
            runner = consumer.ordered_runner = cls(app, consumer)
        return runner

    def reconnected(self) -> None:
        """The consumer's connection was lost: what it held went back to the broker, in order, and comes
        again. Forget it (a run in progress finishes, but its ack is lost with the connection)."""
        self.generation += 1
        self.lanes.clear()
        self.parking = Parking(lambda: self.app.context)
        self._cancel_timers()

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
            self.epochs[partition] += 1
            self.lanes.pop(partition, None)
            self.paused.discard(partition)
        self._cancel_timers(partition)
        self.parking.forget(partition)

    def stop(self) -> None:
        """The worker stops: held retries are dropped (their messages go back to the broker, unacked)."""
        self.stopped = True
        self.timers.stop()
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)

    def _cancel_timers(self, partition: str | None = None) -> None:
        self.timers.cancel(partition)

    # -- a message arrives ---------------------------------------------------------------------------

    def on_message(self, task: Any, message: Any, ack: Any, reject: Any, partition: str | None = None) -> None:
        """A message of ``partition`` (by default: the queue of Celery's task consumer it came from)."""
        handler = task.handler
        args, kwargs, _ = message.decode()
        info = message.delivery_info
        delivery = Delivery(
            message.headers,
            partition or self.partition_of(info.get("consumer_tag")) or handler.queue,
            info.get("exchange") or "",
            info.get("routing_key") or "",
            args,
            kwargs,
        )
        key = key_of(self.app, handler, message, delivery, ack, reject, self.errors)
        if key is None:
            return
        held = Held(str(key), self.generation, self.epochs[delivery.queue], task, message, ack, reject, delivery)
        if self.lanes[held.partition].offer(held.key, held):
            self.submit(held)

    def partition_of(self, tag: Any) -> str | None:
        """The queue a consumer tag consumes. Upstream: kombu's ``Consumer`` keeps queue name -> tag."""
        tags = getattr(self.consumer.task_consumer, "_active_tags", {})
        return next((queue for queue, known in tags.items() if known == tag), None)

    # -- running -------------------------------------------------------------------------------------

    def submit(self, held: Held) -> None:
        if self.stopped:
            return
        if self.executor is not None:
            self.executor.submit(self.run, held)
        elif threading.get_ident() == self.loop_thread:
            self.run(held)
        else:  # a held retry's timer: back to the event loop's thread, where solo runs everything
            self.consumer.call_soon(self.run, held)

    def run(self, held: Held | None) -> None:
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

    def current(self, held: Held) -> bool:
        """Is ``held`` still this worker's (not gone with a connection, or with its partition)?"""
        return held.generation == self.generation and held.epoch == self.epochs[held.partition] and not self.stopped

    def run_one(self, held: Held) -> Held | None:
        """Run one message; returns the next one of its key to run now, if any."""
        parking, delivery = self.parking, held.delivery
        try:
            action = held.action
            if action is None:
                action = parking.admit(held.partition, held.key, delivery.event_id, delivery.headers)
                if not takes_part(action, parking, held.partition, held.key, held.message):
                    return self.done(held)
                held = replace(held, action=action)
            outcome = run_here(self.app, held.task, delivery, held.message.delivery_info, self.consumer.hostname)
            if isinstance(outcome, Redeliver):  # its retry: the later messages of its key wait behind it
                again = replace(held, delivery=retried(delivery, outcome))
                self.later(min(float(outcome.delay), LONGEST_HOLD), again)
                return None
            archived = isinstance(outcome, SendToArchive)
            parking.ran(held.partition, held.key, delivery.event_id, action, archived, held.task.handler.parks)
        except Reject as exc:  # the handler rejected its message itself: it gives up its place
            held.reject(logger, self.errors, exc.requeue)
            return self.lanes[held.partition].finish(held.key) if self.current(held) else None
        except Exception:  # the outcome could not be carried out (the broker went away): try again
            logger.exception("could not settle %s[%s]; running it again", held.task.name, delivery.event_id)
            self.later(SETTLE_AGAIN_AFTER, held)
            return None
        return self.done(held)

    def done(self, held: Held) -> Held | None:
        """Ack ``held``; returns the next message of its key to run now, if any."""
        held.ack(logger, self.errors)
        return self.lanes[held.partition].finish(held.key) if self.current(held) else None

    def later(self, seconds: float, held: Held) -> None:
        self.timers.call_after(seconds, lambda: self.submit(held), held.partition)


def takes_part(action: Action, parking: Parking, partition: str, key: str, message: Any) -> bool:
    """Does a message admitted with ``action`` run? If not, it is parked now, or was a release command."""
    if action is Action.PARK:
        stored = StoredMessage(message.headers, message.body, message.content_type, message.content_encoding)
        parking.park(partition, key, stored)
    elif action is Action.RELEASE:
        parking.release(partition, key)
    elif action is Action.DROP:
        logger.info("key %r no longer waits for %s: release command dropped", key, message.headers.get("id"))
    return action not in (Action.PARK, Action.RELEASE, Action.DROP, Action.DONE)


def ordered_strategy(task: Any, app: Any, consumer: Any) -> Callable[..., Any]:
    """The strategy of an ordered handler's task: every message goes to the consumer's :class:`OrderedRunner`."""
    runner = OrderedRunner.of(app, consumer)

    def on_message(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **more: Any) -> None:
        runner.on_message(task, message, ack, reject)

    return on_message


def key_of(
    app: Any, handler: Any, message: Any, delivery: Delivery, ack: Any, reject: Any, errors: Any = ()
) -> str | None:
    """The key of a message of an ordered handler; ``None`` when it was sent on or settled instead.

    An event that came without a slot (from the intake queue: fired without
    a key, or by a producer that gives only the key) is published again with
    its key (the ``event_key`` header, else the argument its handler names)
    and the key's slot, through the ordered exchange to its partition (its
    place among that key's events: now); this copy is acked. One whose
    arguments give no key is archived as ``bad_arguments``.
    """
    key = message.headers.get(EVENT_KEY)
    context = app.context
    if key is not None and delivery.queue != intake_queue_name(context.name):
        return str(key)
    try:
        found = event_key(key if key is not None else handler.key_of(tuple(delivery.args), dict(delivery.kwargs)))
    except (BadArguments, ValueError) as exc:
        handling.refuse(context, replace(delivery, raw_body=message.body), Reason.BAD_ARGUMENTS, exc)
        ack(logger, errors)
        return None
    slotted = OutgoingMessage(
        ordered_exchange_name(context.name),
        delivery.routing_key,
        {**message.headers, EVENT_KEY: found, EVENT_SLOT: slot_of(found)},
        message.body,
        delivery.event_id,
        message.content_type,
        message.content_encoding,
    )
    try:
        publish_routed(context, slotted)
    except Exception:  # it comes back (dead-lettered to the intake queue) and is sent on again
        logger.exception("could not send event %s on to its partition; it comes back", delivery.event_id)
        reject(logger, errors, False)
        return None
    ack(logger, errors)
    return None


def retried(held_delivery: Delivery, retry: Redeliver) -> Delivery:
    """The delivery a held retry runs with: the retry copy's headers and arguments."""
    copy = retry.copy
    return replace(held_delivery, headers=copy.headers, args=copy.body[0], kwargs=copy.body[1])


def keeping_marks(retry: Redeliver, headers: Mapping[str, Any]) -> Redeliver:
    """``retry`` with the release marks of the message it retries (they belong to one copy otherwise)."""
    marks = {name: headers[name] for name in (RELEASED_BEHIND, RELEASED_LAST) if name in headers}
    return replace(retry, copy=replace(retry.copy, headers={**retry.copy.headers, **marks}))
