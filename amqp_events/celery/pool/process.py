"""One process of the consuming pool: a solo worker of the service, with its own connection, that consumes.

It runs what a ``-P solo`` worker runs (the one dispatcher, acks sent together, ordered partitions, coroutine
handlers on its loop), minus what the main process does once for the whole worker: remote control, heartbeats,
health probes, the metrics endpoint, inbox pruning and the breakers' state machines. It adds:

* time limits: a run's hard deadline is written to shared memory (the main process kills a run past it); a soft
  limit raises Celery's ``SoftTimeLimitExceeded`` in the handler (sync handlers run on the main thread);
* recycling: after ``--max-tasks-per-child`` messages, or once its peak RSS is over ``--max-memory-per-child``
  KiB, the process stops as a warm shutdown does, and the main process starts another;
* the breakers and remote control: it stops and starts consuming a queue as the main process's breaker of its
  handler, and ``cancel_consumer``/``add_consumer`` sent to the main process, say;
* SIGTERM (or its parent's death) stops it warmly; SIGINT (a terminal's Ctrl-C) is the main process's.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import resource
import signal
import threading
from dataclasses import dataclass, replace
from typing import Any

from billiard import process as billiard_process
from celery import bootsteps
from celery.concurrency.solo import TaskPool as SoloPool
from celery.exceptions import SoftTimeLimitExceeded
from celery.worker import state
from kombu.asynchronous import set_event_loop

from amqp_events.breakers.worker import TICK
from amqp_events.celery.health import HealthProbes
from amqp_events.celery.pool.shared import Shared, SlotRuns, run_key
from amqp_events.celery.pool.turns import SharedTurns
from amqp_events.celery.steps import (
    BreakerControl,
    BreakerState,
    Heartbeat,
    InboxPruning,
    MetricsEndpoint,
    breakers_of,
    start_consuming,
    stop_consuming,
)
from amqp_events.core.context import Attempt, HandlerCall, Middleware, ServiceContext
from amqp_events.core.delivery import Delivery
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Lost, Outcome, decide, hand_back_later
from amqp_events.coroutines import is_coroutine_handler
from amqp_events.errors import ProcessStopping
from amqp_events.limits.waiting import Waiting
from amqp_events.wire.message import X_DELIVERY_COUNT, delivery_count, json_text

logger = logging.getLogger(__name__)

#: What the main process does once for the whole worker (worker steps, then consumer steps).
MAIN_PROCESS_STEPS = ((MetricsEndpoint, BreakerState), (BreakerControl, Heartbeat, InboxPruning, HealthProbes))
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Assignment:
    """What a pool process is told when it forks: its slot, its worker's name and options, its limits."""

    slot: int
    hostname: str
    shared: Shared
    time_limit: float | None = None
    soft_time_limit: float | None = None
    max_tasks: int | None = None
    max_memory_kib: int | None = None
    #: The worker's options a solo worker takes as they are (-E, -O, --prefetch-multiplier, ...).
    worker_options: tuple[tuple[str, Any], ...] = ()


class ProcessPool(SoloPool):  # type: ignore[misc]
    """The solo pool of one process of the consuming pool, whose time limits the main process enforces."""

    enforces_time_limits = True
    #: What the process shares with the main process, and its slot there (set as it forks: one process, one pool).
    shared: Shared
    slot: int


def serve(app: Any, assignment: Assignment) -> None:
    """The process's life (``multiprocessing``'s target): a solo worker until told to stop."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _log_as_process(app, assignment)
    set_event_loop(None)  # the main process's hub polls an epoll instance this process shares: make its own
    app.conf.worker_enable_remote_control = False  # the main process answers for the worker
    worker_steps, consumer_steps = MAIN_PROCESS_STEPS
    app.steps["worker"].difference_update(worker_steps)
    app.steps["consumer"].difference_update(consumer_steps)
    app.steps["consumer"].add(FollowMainProcess)
    ProcessPool.shared, ProcessPool.slot = assignment.shared, assignment.slot
    Waiting.peers = SharedTurns(assignment.shared, assignment.slot)  # the longest waiting event asks first
    stopping = Stopping()
    app.add_middleware(ProcessRuns(app, assignment, stopping))  # before the worker reads the app's context
    stopping.worker = app.WorkController(
        hostname=assignment.hostname,
        pool_cls=ProcessPool,
        concurrency=1,
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        beat=False,
        statedb=None,
        **dict(assignment.worker_options),
    )
    signal.signal(signal.SIGTERM, lambda *_: stopping.stop("SIGTERM"))
    stopping.worker.start()
    raise SystemExit(stopping.worker.exitcode or 0)


class Stopping:
    """Stops the process's worker warmly, from a signal handler or a run's end, once."""

    def __init__(self) -> None:
        self.worker: Any = None
        self.why: str | None = None

    def stop(self, why: str) -> None:
        if self.why is None:
            self.why = why
            logger.info("pool process %d stops (%s)", os.getpid(), why)
        state.should_stop = 0  # the event loop raises WorkerShutdown at its next turn
        consumer = getattr(self.worker, "consumer", None)
        if consumer is not None and hasattr(consumer, "wake_event_loop"):
            consumer.wake_event_loop()


class ProcessRuns(Middleware):
    """What a pool process adds to each run: its place in the shared memory (a run lost with a process before is
    counted as such), its time limits, and the process's recycling after ``max_tasks`` messages or at
    ``max_memory_kib``."""

    def __init__(self, app: Any, assignment: Assignment, stopping: Stopping) -> None:
        self.slot = SlotRuns(assignment.shared, assignment.slot)
        self.index = {name: index for index, name in enumerate(assignment.shared.handlers)}
        self.hostname = assignment.hostname
        self.max_tasks, self.max_memory_kib, self.stopping = assignment.max_tasks, assignment.max_memory_kib, stopping
        self.taken = 0
        self.places: dict[int, int | None] = {}
        self.soft = threading.local()

    def before_handle(self, attempt: Attempt) -> Outcome | None:
        if attempt.kind != "run" or attempt.handler is None:
            return None
        delivery = attempt.delivery
        if self.stopping.why is not None and not attempt.handler.ordered:  # taken in the loop's last turn
            return hand_back_later(delivery, attempt.context.now(), error=ProcessStopping(self.stopping.why))
        key = run_key(attempt.handler.task_name, delivery.event_id, delivery.retries, delivery.lost_runs)
        # Only a message the broker says came back (its count of returns, which the router keeps on redeliveries
        # alone) can be a lost run: a sender's fresh copy under the same id never is, nor clears the entry.
        if X_DELIVERY_COUNT in delivery.headers:
            if self.slot.shared.was_lost(key):  # counted, as prefork does
                return decide(delivery, Lost(), attempt.context.handling(attempt.handler), attempt.context.now())
            # Prefetched by processes that ended: as many returns as processes ended are not charged to it.
            charged = max(0, delivery_count(delivery.headers) - self.slot.shared.ended.value)
            attempt.delivery = replace(delivery, headers={**delivery.headers, X_DELIVERY_COUNT: charged})
        self.places[id(attempt)] = self.slot.started(key, shown(attempt.handler.task_name, delivery))
        return None

    def wrap_run(self, context: ServiceContext, handler: Handler, run: HandlerCall) -> HandlerCall:
        if is_coroutine_handler(handler.function):  # a coroutine's own limit cancels it
            return run
        index = self.index.get(handler.task_name, -1)

        def limited(attempt: Attempt, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            soft, hard = self.slot.limits_of(index)  # as remote control (celery control time_limit) set them
            if not (soft or hard):
                return run(attempt, args, kwargs)
            token = self.slot.limit(index, hard) if hard else None
            alarm = soft > 0 and threading.current_thread() is threading.main_thread()
            if alarm:
                self.soft.limit = soft
                signal.signal(signal.SIGALRM, self._soft_limit_reached)
                signal.setitimer(signal.ITIMER_REAL, float(soft or 0))
            try:
                return run(attempt, args, kwargs)
            finally:
                if alarm:
                    self.soft.limit = None
                    signal.setitimer(signal.ITIMER_REAL, 0)
                if token is not None:
                    self.slot.unlimit(token)

        return limited

    def _soft_limit_reached(self, *_: Any) -> None:
        limit = getattr(self.soft, "limit", None)
        if limit is not None:  # a run is still in progress
            self.soft.limit = None
            raise SoftTimeLimitExceeded(f"soft time limit ({limit:g}s) exceeded")

    def after_handle(self, attempt: Attempt, outcome: Outcome | None, error: BaseException | None) -> None:
        handler = self.index.get(attempt.handler.task_name, -1) if attempt.handler is not None else -1
        self.slot.ended(self.places.pop(id(attempt), None), handler if attempt.kind == "run" else -1)
        self.taken += 1
        if self.max_tasks and self.taken >= self.max_tasks:
            self.stopping.stop(f"recycled after {self.taken} messages: --max-tasks-per-child {self.max_tasks}")
        elif self.max_memory_kib:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
            if peak > self.max_memory_kib:
                self.stopping.stop(f"recycled at {peak} KiB resident: --max-memory-per-child {self.max_memory_kib}")


def shown(task: str, delivery: Delivery) -> bytes:
    """What ``inspect active`` shows of a run (:class:`amqp_events.celery.pool.mirror.ProcessRun` reads it back):
    its task, id, how it was routed, and its arguments as JSON (cut at what the slot holds)."""
    fields = (task, delivery.event_id, delivery.exchange, delivery.routing_key)
    arguments = json_text([list(delivery.args), dict(delivery.kwargs)])
    return "\0".join((*fields, arguments)).encode("utf-8", "surrogatepass")


class FollowMainProcess(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer step of a pool process: consume a queue only while the main process's breaker of its handler is
    not open and remote control did not cancel it (the state machines, the operator's holds and the remote
    control are the main process's); say whether it consumes (the main process's readiness)."""

    label = "amqp-events main process followed"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.timer_entry: Any = None
        self.paused: set[str] = set()

    def start(self, c: Any) -> None:
        self.paused = set()  # a new consumer has every queue: those paused are taken out before the loop consumes
        self.follow(c)
        if self.timer_entry is None:
            self.timer_entry = c.timer.call_repeatedly(TICK, self.follow, (c,))
        c.pool.shared.prefetch[c.pool.slot] = getattr(c.qos, "value", 0) or 0  # what `inspect stats` sums
        c.pool.shared.consuming[c.pool.slot] = 1

    def stop(self, c: Any) -> None:
        c.pool.shared.consuming[c.pool.slot] = 0  # until it is connected again
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None

    shutdown = stop

    def follow(self, c: Any) -> None:
        breakers = breakers_of(c.app)
        paused = c.pool.shared.cancelled_queues()
        if breakers is not None:
            paused |= breakers.open_queues()
        for queue in paused - self.paused:
            stop_consuming(c, queue)
        for queue in self.paused - paused:
            start_consuming(c, queue)
        self.paused = paused


def _log_as_process(app: Any, assignment: Assignment) -> None:
    """``-f worker-%i.log``: a file per process, as Celery's prefork children have (``%i`` is 1, 2, ... here, the
    main process's 0). Upstream: Celery reads a process's index from billiard's ``current_process()``, and the
    main process leaves the log file it was given in ``CELERY_LOG_FILE``."""
    logfile = os.environ.get("CELERY_LOG_FILE") or ""
    if "%i" not in logfile.lower():
        return
    billiard_process.current_process().index = assignment.slot
    app.log.already_setup = False
    app.log.setup(int(os.environ.get("CELERY_LOG_LEVEL") or 0), logfile, hostname=assignment.hostname)


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when the main process dies (even by SIGKILL), so no orphan consumes on."""
    parent = multiprocessing.parent_process()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the process ends when its connection's worker is gone
        return
    if parent is not None and os.getppid() != parent.pid:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
