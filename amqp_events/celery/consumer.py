"""Celery's task consumer for an events app (``worker_consumer``, set by ``events_app``).

* On every (re)connection it declares the service's topology before any
  queue is consumed. A declaration error stops the worker with a message
  that names the queue, the argument and both values (raised from the
  consumer's start-up, where Celery treats it as unrecoverable). A worker
  that ends up consuming none of its service's event queues says so loudly.
* Every message goes through the one dispatcher (:mod:`amqp_events.dispatch.dispatcher`): routed, then archived,
  run here or handed to Celery's request path; never dropped or requeued in a loop.
* With the solo pool, acks are sent at once; a warm shutdown wakes the event
  loop at once (:mod:`amqp_events.celery.loop`).
* Acks of a fast run of messages on the task channel are sent together, with ``multiple``, before the event
  loop's next poll (:mod:`amqp_events.transport.acks`): one frame, and one settlement on the broker, for the run.
  The ack of a message a copy replaced (retried, archived, counted as a lost run) goes out at once, with what is
  held, before the next message runs (on Celery's request path where handlers run in-process, that of a message
  that may be counted as a lost run).

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/broker/test_celery_compat.py, tests/broker/test_worker_startup.py,
tests/broker/test_bad_input.py).
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from celery import signals
from celery.worker import state as worker_state
from celery.worker.consumer import Consumer
from kombu import Connection
from kombu.message import Message
from vine import promise

from amqp_events.celery.coroutine_loop import CoroutineRunner
from amqp_events.celery.host import Host
from amqp_events.celery.limited_queues import LimitedQueues
from amqp_events.celery.loop import LoopWaker, acked_unheld, acks_now, call_now, run_queued
from amqp_events.celery.ordered import runner_of
from amqp_events.celery.pool.shared import Revoked
from amqp_events.celery.prefetch import size_prefetch
from amqp_events.celery.running import CeleryRuntime
from amqp_events.celery.startup_warnings import (
    warn_of_shared_limited_queues,
    warn_of_time_limits,
    warn_of_unverified_authors,
)
from amqp_events.celery.steps import breakers_of
from amqp_events.celery.tags import ConsumedQueues
from amqp_events.core import addressing
from amqp_events.core.context import ServiceContext
from amqp_events.core.delivery import Answer
from amqp_events.core.router import ToArchive, route
from amqp_events.coroutines import is_coroutine_handler
from amqp_events.dispatch.dispatcher import Dispatcher, inline
from amqp_events.dispatch.settling import Archiver, ChannelSettler
from amqp_events.errors import PermissionRefused, TopologyMismatch, TopologyMissing, WorkerStartError
from amqp_events.ordering.runner import OrderedRunner
from amqp_events.transport.acks import MAX_HOLD, HeldAcks
from amqp_events.transport.declare import declare_topology
from amqp_events.transport.decoders import bound_decoders
from amqp_events.wire.bounds import decoding_reason
from amqp_events.wire.message import Reason

logger = logging.getLogger(__name__)


class EventConsumer(Consumer):  # type: ignore[misc]
    app: Any
    hub: Any
    #: Runs the messages of ordered handlers (:mod:`amqp_events.celery.ordered`), made by their strategy.
    ordered_runner: OrderedRunner | None = None
    #: Runs the messages of coroutine handlers on the worker's event loop (solo and threads pools).
    coroutine_runner: CoroutineRunner | None = None
    #: The task channel's acks, sent together before each poll (none without an event loop).
    held_acks: HeldAcks | None = None
    #: Callbacks given after the consumer stopped, run at its shutdown (while the connection is open).
    after_stop: collections.deque[Callable[[], Any]] | None = None
    _dispatcher: Dispatcher | None = None

    class Blueprint(Consumer.Blueprint):  # type: ignore[misc]
        # Upstream (5.5+): the DelayedDelivery step declares 28 queues of its own on every vhost with quorum
        # queues and binds ours to them. Delays here go through the library's ladder, routed to one queue.
        default_steps: ClassVar[list[str]] = [
            step for step in Consumer.Blueprint.default_steps if not step.endswith(":DelayedDelivery")
        ]

    @functools.cached_property
    def host(self) -> Host:
        """What the worker's pool can do: read once, by the blueprint's steps before ``__init__`` returns too."""
        return Host.of(self.pool)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        host = self.host
        if host.refused:
            raise WorkerStartError(
                f"the {self.pool.__module__.rpartition('.')[2]} pool is not supported: {host.refused}. For handlers "
                "that wait on I/O use -P gevent -c N (or -P threads -c N)"
            )
        coroutines = [h.name for h in self.app.handlers.values() if is_coroutine_handler(h.function)]
        if coroutines and host.greenlets:
            # Each greenlet would run an event loop of its own inside gevent's: neither loop would know the other.
            raise WorkerStartError(
                f"coroutine handlers ({', '.join(coroutines)}) cannot run under -P gevent: run this service's "
                "worker with -P solo, -P threads or -P prefork"
            )
        settings = self.app.context.settings
        bound_decoders(settings.max_body_bytes)
        warn_of_time_limits(self.app, self.pool)
        warn_of_unverified_authors(self.app.context)
        warn_of_shared_limited_queues(self.app.context)
        on_its_loop = bool(coroutines) and host.runs_here
        in_flight = settings.async_concurrency if on_its_loop else 0
        size_prefetch(self, settings.worker_prefetch_limit, len(self.app.amqp.queues.consume_from), in_flight)
        runs_at_once = max(host.runs_at_once, in_flight)
        self.limited_queues = LimitedQueues(self, runs_at_once)
        self.archiver = Archiver(lambda: self.app.context, self.timer)
        self.consumed_queues = ConsumedQueues()
        self.waker = LoopWaker(self.hub) if self.hub is not None else None
        if on_its_loop:
            self.coroutine_runner = CoroutineRunner(
                self.hub, self.wake_event_loop, settings.async_concurrency, settings.async_shutdown_timeout
            )
        if self.hub is not None:
            self.hub.on_tick.add(self.before_poll)
        self.loop_thread = threading.get_ident()
        signals.worker_shutting_down.connect(self.wake_event_loop)  # weak: goes with the consumer

    def register_with_event_loop(self, hub: Any) -> None:
        """Upstream: called in the event loop's thread each time it starts (on every connection), after
        ``hub.reset()`` dropped its readers. That thread steps the coroutine handlers' loop (Celery's
        ``start_worker`` runs it in another thread than the one that made the consumer), and the waker must be
        read again."""
        super().register_with_event_loop(hub)
        self.loop_thread = threading.get_ident()
        if self.coroutine_runner is not None:
            self.coroutine_runner.loop_started()
        if self.waker is not None:
            self.waker.keep_reading()

    def call_soon(self, *args: Any, **kwargs: Any) -> Any:
        """Upstream (5.5, 5.6 acks; 5.7 other callbacks): a callback queued from another thread (the threads
        pool's) waits until the event loop's poll ends, which takes up to a second once the prefetch window
        is full and nothing arrives: wake the loop."""
        if self.after_stop is not None:
            return self._after_stop(*args, **kwargs)
        queued = super().call_soon(*args, **kwargs)
        if threading.get_ident() != self.loop_thread:
            self.wake_event_loop()
        return queued

    def call_soon_ack(self, *args: Any, **kwargs: Any) -> Any:
        """Upstream (5.7): acks and rejects, queued as :meth:`call_soon` queues them."""
        if self.after_stop is not None:
            return self._after_stop(*args, **kwargs)
        queued = super().call_soon_ack(*args, **kwargs)
        if threading.get_ident() != self.loop_thread:
            self.wake_event_loop()
        return queued

    def _after_stop(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Upstream (5.7): the hub runs its queued callbacks no more once it closed, before the consumer's
        shutdown; what finishes meanwhile (the threads pool stopping, coroutine handlers) is settled there."""
        assert self.after_stop is not None
        self.after_stop.append(functools.partial(callback, *args, **kwargs))

    def wake_event_loop(self, **_: Any) -> None:
        """Upstream: a warm shutdown only sets a flag the event loop reads between polls, and a poll lasts
        up to 10 s when nothing arrives; kombu < 5.7 has no way to wake it from a signal handler."""
        if self.waker is not None:
            self.waker.wake()

    def before_poll(self) -> None:
        """In each turn of the event loop, before it polls: coroutine handlers stepped, then the acks held
        (theirs among them) sent together."""
        if self.coroutine_runner is not None:
            self.coroutine_runner.before_poll()
        if self.held_acks is not None:  # a run of Celery's pool that ends wakes the loop: its ack may join these
            # Those its pool holds too (prefetched, not yet started by a child): they end soon after, or the held
            # acks' timer sends them.
            self.held_acks.send_if_waiting(len(worker_state.reserved_requests))

    def stop(self) -> None:
        self.after_stop = self.after_stop if self.after_stop is not None else collections.deque()
        self.stop_holding_acks()
        self.finish_coroutines()
        if self.ordered_runner is not None:  # its running lanes finish while the partitions' channels are open
            self.ordered_runner.stop()
        if self.hub is not None:
            run_queued(self.hub)
        self.settle_after_stop()
        super().stop()

    def settle_after_stop(self) -> None:
        while self.after_stop:
            call_now(self.after_stop.popleft())

    def finish_coroutines(self) -> None:
        """The event loop turns no more: the running coroutine handlers finish now, before the threads pool and
        the ordered runner stop (their threads may wait on the coroutines' loop)."""
        if self.coroutine_runner is not None:
            self.coroutine_runner.finish()

    def shutdown(self) -> None:
        self.stop_holding_acks()  # before Celery's pending acks, which then go straight out
        self.finish_coroutines()
        signals.worker_shutting_down.disconnect(self.wake_event_loop)
        if self.ordered_runner is not None:
            self.ordered_runner.stop()
        if self.coroutine_runner is not None:  # before the connection closes: their acks go out first
            self.coroutine_runner.stop()
            self.coroutine_runner = None
        self.settle_after_stop()
        if self.waker is not None:
            self.waker.close()
            self.waker = None
        super().shutdown()

    def connect(self) -> Any:
        if self.ordered_runner is not None:  # what it held went back to the broker with the old connection
            self.ordered_runner.reconnected()
        connection = super().connect()
        declare_on_connect(self.app.context, connection, self.app.amqp.queues.consume_from)
        return connection

    @property
    def dispatcher(self) -> Dispatcher:
        """Carries out each message's route: made again with the task handler on every connection, and at once
        when a partition's consumer (started by an earlier step) takes a message before that."""
        if self._dispatcher is None:
            self._dispatcher = self.make_dispatcher(promise)
        return self._dispatcher

    def create_task_handler(self, promise: Callable[..., Any] = promise) -> Callable[[Message], Any]:
        if self.host.consumes_in_processes:  # the pool's processes consume: this process, none of the queues
            for queue in list(self.task_consumer.queues):
                self.task_consumer.cancel_by_queue(queue.name)
            return self.on_message_of_no_queue
        self._dispatcher = self.make_dispatcher(promise)
        self.hold_acks()

        def on_task_received(message: Message) -> Any:
            queue = self.consumed_from(message)
            if queue is None:  # which handlers may run it is not known: back to its queue, for another delivery
                logger.warning("a message came with a consumer tag this worker does not know: returned to its queue")
                return self.settler_of(message).settle(Answer.REQUEUE)
            self.limited_queues.seen(queue)
            self.dispatcher.dispatch(message, queue, self.settler_of(message))
            return None

        self.task_consumer.on_message = on_task_received  # what the limited queues' consumers deliver, from now
        self.limited_queues.start()
        return on_task_received

    def on_message_of_no_queue(self, message: Message) -> None:
        logger.warning("the main process of a consuming pool received a message: returned to its queue")
        self.settler_of(message).settle(Answer.REQUEUE)

    # Remote control's ``cancel_consumer`` and ``add_consumer``: with a consuming pool, its processes follow; with
    # the others, a queue whose breaker is open is consumed once the breaker lets it (steps.resume_consuming).

    def cancel_task_queue(self, queue: str) -> None:
        if not self.host.consumes_in_processes:
            return super().cancel_task_queue(queue)  # type: ignore[no-any-return]
        self._processes_consume(queue, False)

    def add_task_queue(self, queue: str, *args: Any, **options: Any) -> None:
        if self.host.consumes_in_processes:
            return self._processes_consume(queue, True)
        queues, name = self.app.amqp.queues, self.queue_named(queue)
        if name in queues:  # selected, as upstream 5.6+ does (5.5 only consumed it: a breaker would not resume it)
            queues.select_add(queues[name])
            breakers = breakers_of(self.app)
            if breakers is not None and name in breakers.held_queues():
                logger.info("queue %s is consumed once its handler's breaker lets it", name)
                return None
        return super().add_task_queue(name, *args, **options)  # type: ignore[no-any-return]

    def queue_named(self, queue: str) -> str:
        """The queue remote control names: as upstream, by an alias or by its name."""
        return getattr(self.app.amqp.queues.aliases.get(queue), "name", queue)

    def _processes_consume(self, queue: str, consuming: bool) -> None:
        name = self.queue_named(queue)
        if self.pool.shared.consume(name, consuming):
            logger.info("the pool's processes %s queue %s", "consume" if consuming else "stop consuming", name)
        else:  # the processes forked with the app's queues: another is consumed after a restart naming it (-Q)
            logger.warning("%s is not a queue of the app this worker's processes run: not followed", queue)

    def make_dispatcher(self, promise: Callable[..., Any]) -> Dispatcher:
        host = self.host
        if host.runs_in_the_consumers_thread:
            promise = acks_now(promise, deferred=(self.call_soon, getattr(self, "call_soon_ack", None)))
        celery_path = super().create_task_handler(promise)  # Celery's request path, where it is needed
        if host.runs_here:  # whether a run's copy replaced its message is not known when Celery acks it
            celery_path = acked_unheld(celery_path, self.never_hold)
        eventer = self.event_dispatcher
        runtime = CeleryRuntime(self.app, self.hostname, celery_path, host.runs_here, bool(eventer and eventer.enabled))
        return Dispatcher(
            lambda: self.app.context,
            runtime,
            self.archiver,
            lambda: runner_of(self.app, self),
            executor=host.apply_async or inline,
            coroutines=self.coroutine_runner.submit if self.coroutine_runner is not None else None,
            # A consuming pool's process learns what the main process's remote control revoked through shared memory.
            revoked=Revoked(host.shared) if host.shared is not None else self.controller.state.revoked,
            timer=self.timer,
            on_hold=lambda queue: self.call_soon(self.limited_queues.held, queue),
        )

    def hold_acks(self) -> None:
        """Hold the acks of this connection's task channel, to be sent together before the loop's next poll (or
        once half the prefetch window is held, or after 50 ms). What the previous channel held went back with it."""
        if self.hub is None:
            return
        # Where handlers run in other processes, a slow handler does not hold up this process's loop: hold on.
        gap = None if self.host.runs_here else MAX_HOLD
        self.held_acks = HeldAcks(
            self.task_consumer.channel, lambda: (getattr(self.qos, "value", 0) or 128) // 2, self.hub.call_later, gap
        )

    def settler_of(self, message: Message) -> ChannelSettler:
        """Settles a message of the task channel, from this consumer's thread; the ack of a message a copy
        replaced is not held."""
        return ChannelSettler(message, self.call_soon, self.never_hold)

    def never_hold(self, message: Message) -> None:
        held = self.held_acks
        if held is not None and message.channel is held.channel:  # not a partition's, nor a closed channel's
            held.never_hold(message.delivery_tag)

    def stop_holding_acks(self) -> None:
        """Send what is held; from now on each ack goes out at once (the loop may not poll again)."""
        held, self.held_acks = self.held_acks, None
        if held is not None:
            held.uninstall()

    def consumed_from(self, message: Message) -> str | None:
        """The queue ``message`` came from, by its consumer tag: which handlers may run it
        (:func:`amqp_events.core.addressing.address`); ``None`` when not known."""
        return self.consumed_queues.of(self.task_consumer, (message.delivery_info or {}).get("consumer_tag"))

    # Upstream's hooks for messages it cannot run, should one reach them after all (a handler registered
    # after the consumer started): it acks and drops undecodable ones, and rejects unknown tasks (which the
    # queue's dead-letter exchange would bring straight back). Each is archived instead.

    def on_decode_error(self, message: Message, exc: Exception) -> None:
        routed = route(self.app.context, message, self.consumed_from(message) or "")
        self._archive(message, routed if isinstance(routed, ToArchive) else ToArchive(decoding_reason(exc), exc))

    def on_unknown_message(self, body: Any, message: Message) -> None:
        self._archive(message, ToArchive(Reason.UNDECODABLE, addressing.not_an_event()))

    def on_unknown_task(self, body: Any, message: Message, exc: Exception) -> None:
        name = (message.headers or {}).get("task")
        self._archive(message, ToArchive(Reason.UNKNOWN_EVENT, addressing.unknown_event(self.app.service, name)))

    def on_invalid_task(self, body: Any, message: Message, exc: Exception) -> None:
        self._archive(message, ToArchive(decoding_reason(exc), exc))

    def _archive(self, message: Message, archive: ToArchive) -> None:
        self.archiver.take(message, self.settler_of(message), archive)


def declare_on_connect(context: ServiceContext, connection: Connection, consumed: Mapping[str, Any]) -> None:
    """Declare the service's topology on a new connection; complain if no event queue is consumed."""
    try:
        declare_topology(connection, context.topology)
    except (TopologyMismatch, TopologyMissing, PermissionRefused) as exc:
        logger.critical("cannot start service %r: %s", context.name, exc)
        raise
    event_queues = {queue.name for queue in context.topology.event_queues}
    if not event_queues & set(consumed):
        logger.error(
            "service %r: this worker consumes none of the service's event queues (%s), so no event reaches it. %s",
            context.name,
            ", ".join(sorted(event_queues)) or "it has no handler",
            "Register handlers in modules the worker imports (the app's imports= or include=, "
            "`celery worker --include`, or app.autodiscover_tasks())"
            if not event_queues
            else "Check the worker's -Q/-X options.",
        )
