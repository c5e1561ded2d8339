"""Circuit breakers in a worker: pause consuming a failing handler's queue, resume after the cool-down.

The state lives in the worker's main process (:class:`WorkerBreakers`):
the process running a handler (a pool child, or the worker itself with the
solo pool) counts each run's outcome in shared memory; the main process
reads the counts ten times a second, steps the :mod:`amqp_events.breakers.breaker` state
machines, and on a trip cancels the consumer of that handler's queue only;
other handlers go on. The queue's messages stay on the broker, in order.
When the open period ends (or the hold of an operator or a health check is
released) the worker consumes the queue again, half-open. A handler that shares
its queue with the service's others (``per_service``) cannot stop it: each of
its events taken meanwhile waits ``amqp_events_paused_wait`` seconds on the broker's
delay ladder and comes back, unrun and uncounted, until the breaker lets it run.

A message already prefetched when a breaker opened is handed back: a copy
with unchanged counters goes to the end of its queue, then the original is
acked, so it never counts as a failed attempt. The shared arrays are
created before the pool's children fork.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import time
from collections.abc import Callable, Iterable, Mapping

from amqp_events.breakers.breaker import Breaker, BreakerPolicy, State, Transition
from amqp_events.breakers.health import Health, HealthCheck, HealthRunner
from amqp_events.breakers.options import breaker_option, required_checks
from amqp_events.core.context import Attempt, Middleware
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Ack, Outcome, Redeliver, SendToArchive, hand_back_later
from amqp_events.errors import OverLimit
from amqp_events.metrics import record_breaker, record_health
from amqp_events.wire.message import Reason

logger = logging.getLogger(__name__)

#: Seconds between two looks at the breakers' clocks and the health checks' states.
TICK = 0.1
#: What the pool children read per handler: its breaker's state, and PROBING once a child took the one
#: message a half-open breaker lets through.
PROBING = 3
#: The hold an operator puts on a breaker (``amqp-events breakers open``).
OPERATOR = "operator"


class WorkerBreakers:
    """The breakers of one worker's handlers, and the health checks they depend on.

    Breakers are kept by handler (its task name). ``pause(queue)`` and ``resume(queue)`` stop and start
    consuming the queue of a handler that has one of its own
    (the worker's consumer does that: :mod:`amqp_events.celery.steps`).
    """

    def __init__(
        self,
        service: str,
        handlers: Iterable[Handler],
        default: BreakerPolicy | None,
        checks: Mapping[str, HealthCheck],
        paused_wait: int = 30,
    ) -> None:
        self.service = service
        #: Seconds an event of a paused handler that shares its queue waits on the broker at a time.
        self.paused_wait = paused_wait
        self.handlers: dict[str, Handler] = {handler.task_name: handler for handler in handlers}
        policies = {task: BreakerPolicy.of(breaker_option(handler), default) for task, handler in self.handlers.items()}
        self.breakers = {task: Breaker(policy or BreakerPolicy()) for task, policy in policies.items()}
        #: Handlers whose breaker trips on failures (the others only pause when told to).
        self.automatic = {task for task, policy in policies.items() if policy is not None}
        self.slots = {task: index for index, task in enumerate(sorted(self.handlers))}
        consumers = collections.Counter(handler.queue for handler in self.handlers.values())
        #: Handlers that share their queue (``per_service``): pausing one cannot stop consuming it.
        self.sharing = {task for task, handler in self.handlers.items() if consumers[handler.queue] > 1}
        # One byte per handler, its State (or PROBING): written here, read by the pool children (forked later) ...
        self.shared = multiprocessing.RawArray("b", max(1, len(self.slots)))
        # ... and two counters per handler, successes and failures, written by them and read here.
        self.outcomes = multiprocessing.Array("q", 2 * max(1, len(self.slots)))
        # ... and per handler, until when (monotonic, system-wide) flow control keeps the worker off its queue.
        self.backing_off = multiprocessing.RawArray("d", max(1, len(self.slots)))
        #: The handlers whose queue this process stopped consuming for flow control (the main process).
        self.backed_off: set[str] = set()
        self.seen = [0] * (2 * max(1, len(self.slots)))
        self.checks = dict(checks)
        for handler in self.handlers.values():
            unknown = set(required_checks(handler)) - set(self.checks)
            if unknown:
                raise ValueError(f"{handler.name} requires unknown health check(s): {', '.join(sorted(unknown))}")
        self.pause: Callable[[str], None] = _nowhere
        self.resume: Callable[[str], None] = _nowhere
        self.runner: HealthRunner | None = None
        self.probing_since: dict[str, float] = {}

    # -- read anywhere (pool children included) ------------------------------------------------------

    def may_run(self, task: str) -> bool:
        """May a message of ``task`` run now? Closed: yes; open: no; half-open: the first one only."""
        slot = self.slots.get(task)
        if slot is None or self.shared[slot] == State.CLOSED:
            return True
        if self.shared[slot] != State.HALF_OPEN:
            return False
        with self.outcomes.get_lock():  # one probe, whichever child asks first
            if self.shared[slot] != State.HALF_OPEN:
                return False
            self.shared[slot] = PROBING
            return True

    def report(self, task: str, failed: bool) -> None:
        """Count a run of ``task``'s handler: ``failed`` for an unexpected failure (retried or archived
        for it); called by the process that ran it."""
        slot = self.slots.get(task)
        if slot is not None and task in self.automatic:  # only breakers that trip on failures read them
            with self.outcomes.get_lock():
                self.outcomes[2 * slot + failed] += 1

    def back_off(self, task: str, seconds: float) -> None:
        """Flow control: ``task``'s limit is reached; the worker stops taking its queue (one of its own) for
        ``seconds``, so that what waits over the limit waits in the queue. Called by any of its processes."""
        slot = self.slots.get(task)
        if slot is not None and task not in self.sharing:
            self.backing_off[slot] = max(self.backing_off[slot], time.monotonic() + seconds)

    def _backing_off(self, task: str, now: float) -> bool:
        return task not in self.sharing and self.backing_off[self.slots[task]] > now

    def _own_queues(self, where: Callable[[str], bool]) -> set[str]:
        """The queues of handlers with a queue of their own (a shared one is never stopped) for which ``where``."""
        return {self.handlers[task].queue for task in self.handlers if task not in self.sharing and where(task)}

    def open_queues(self) -> set[str]:
        """The queues of handlers (with a queue of their own) whose breaker is open, as the main process last set
        it, or that flow control backs off: those a pool process that consumes stops consuming."""
        now = time.monotonic()
        shared, slots = self.shared, self.slots
        return self._own_queues(lambda task: shared[slots[task]] == State.OPEN or self._backing_off(task, now))

    def held_queues(self) -> set[str]:
        """The queues the main process stopped consuming and will start again itself (a pool that does not consume
        in processes): those of open breakers, and those flow control backs off while their breaker is closed."""
        return self._own_queues(lambda task: self.breakers[task].state == State.OPEN or task in self.backed_off)

    def paused_queues(self) -> set[str]:
        """The queues this worker does not consume now: those of handlers (with a queue of their own) whose
        breaker is not closed, or that flow control backs off."""
        now = time.monotonic()
        return self._own_queues(lambda task: self.breakers[task].state != State.CLOSED or self._backing_off(task, now))

    def states(self) -> dict[str, str]:
        """Each handler's breaker state, by handler name (for heartbeats)."""
        return {self.handlers[task].name: str(breaker.state) for task, breaker in self.breakers.items()}

    def health(self) -> dict[str, str]:
        return {name: str(check.state) for name, check in self.checks.items()}

    # -- the main process --------------------------------------------------------------------------

    def start(self, pause: Callable[[str], None], resume: Callable[[str], None]) -> None:
        """The consumer (re)started: stop consuming what is paused; start the health checks once."""
        self.pause, self.resume = pause, resume
        self.backed_off = set()  # a new consumer consumes every queue
        for task, breaker in self.breakers.items():
            record_breaker(self.service, self.handlers[task].name, breaker.state, tripped=False)
            if breaker.state == State.OPEN and task not in self.sharing:
                pause(self.handlers[task].queue)
        if self.checks and self.runner is None:
            self.runner = HealthRunner(list(self.checks.values()))
            self.runner.start()

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
            self.runner = None
        self.pause = self.resume = _nowhere

    def tick(self) -> None:
        """Outcomes reported since the last tick step the breakers; open periods that ended turn
        half-open; health checks hold or release breakers."""
        now = time.monotonic()
        with self.outcomes.get_lock():
            counts = self.outcomes[:]
        for task, slot in self.slots.items():
            successes, failures = (counts[2 * slot + n] - self.seen[2 * slot + n] for n in (0, 1))
            self.seen[2 * slot], self.seen[2 * slot + 1] = counts[2 * slot], counts[2 * slot + 1]
            if task in self.automatic:  # successes first: a failure among them decides a half-open probe
                for failed in [False] * successes + [True] * failures:
                    self._apply(task, self.breakers[task].record(failed, now))
        for name, check in self.checks.items():
            record_health(self.service, name, check.state.gauge)
        for task, breaker in self.breakers.items():
            for name in required_checks(self.handlers[task]):
                reason = f"health check {name} unhealthy"
                if self.checks[name].state == Health.UNHEALTHY:
                    self._apply(task, breaker.hold(reason))
                else:
                    self._apply(task, breaker.release(reason, now))
            self._apply(task, breaker.poll(now))
            self._unless_probe_lost(task, now)
            self._follow_flow_control(task, now)

    def _follow_flow_control(self, task: str, now: float) -> None:
        """Stop consuming a closed breaker's queue while flow control backs it off; start again after."""
        backing_off = self._backing_off(task, now)
        if backing_off == (task in self.backed_off) or self.breakers[task].state != State.CLOSED:
            return
        queue = self.handlers[task].queue
        if backing_off:
            self.backed_off.add(task)
            self.pause(queue)
        else:
            self.backed_off.discard(task)
            self.resume(queue)

    def _unless_probe_lost(self, task: str, now: float) -> None:
        """A probe whose outcome never came (its process died): let another message probe."""
        slot = self.slots[task]
        if self.shared[slot] != PROBING:
            self.probing_since.pop(task, None)
        elif now - self.probing_since.setdefault(task, now) > self.breakers[task].policy.window:
            self.probing_since.pop(task)
            self.shared[slot] = State.HALF_OPEN

    def hold(self, handler: str, reason: str = OPERATOR) -> list[str]:
        """Hold the breakers of the handlers named ``handler`` (function name, full name or event) open."""
        return [task for task in self.matching(handler) if self._apply(task, self.breakers[task].hold(reason))]

    def release(self, handler: str, reason: str = OPERATOR) -> list[str]:
        now = time.monotonic()
        return [task for task in self.matching(handler) if self._apply(task, self.breakers[task].release(reason, now))]

    def matching(self, handler: str) -> list[str]:
        """Queues of the handlers called ``handler``: the function's name, its full name, the event, or the name
        it was registered with."""
        return [task for task, found in self.handlers.items() if found.known_as(handler)]

    def _apply(self, task: str, transition: Transition | None) -> bool:
        if transition is None:
            return False
        if transition.state == State.HALF_OPEN and task not in self.automatic:  # no failures to watch for
            transition = self.breakers[task].close(transition.why)
        name, queue = self.handlers[task].name, self.handlers[task].queue
        self.shared[self.slots[task]] = transition.state
        own_queue = task not in self.sharing
        # Structured fields, as on the lines about events (amqp_events.middleware.logs).
        fields = {"service": self.service, "handler": name, "breaker": transition.state.name.lower()}
        if transition.state == State.OPEN:
            if own_queue:
                self.pause(queue)
            more = f"; resuming in {transition.open_for:g}s" if transition.open_for else ""
            where = (
                f"its queue {queue} is not consumed" if own_queue else f"its events wait {self.paused_wait}s at a time"
            )
            logger.log(
                max(transition.level, logging.WARNING),
                "breaker of %s opened (%s): %s%s",
                name, transition.why, where, more, extra=fields,
            )  # fmt: skip
        else:
            if own_queue:
                self.resume(queue)
            state, why = transition.state, transition.why
            logger.info("breaker of %s %s (%s): running its events again", name, state, why, extra=fields)
        tripped = transition.state == State.OPEN and bool(transition.open_for)
        record_breaker(self.service, name, transition.state, tripped)
        return True


def _nowhere(queue: str) -> None:
    """Pausing and resuming before a consumer started (or after it stopped): its start applies the states."""


class Breakers(Middleware):
    """A worker's breakers as middleware: a message of an open breaker's handler is handed back unrun, and
    each run's outcome is counted for its breaker (by the process that ran it)."""

    def __init__(self, breakers: WorkerBreakers) -> None:
        self.breakers = breakers

    def before_handle(self, attempt: Attempt) -> Outcome | None:
        task = attempt.handler.task_name if attempt.handler is not None else ""
        if self.breakers.may_run(task):
            return None
        # Prefetched before the breaker opened (its queue is not consumed meanwhile), or taken from a queue
        # shared with handlers that go on: it waits on the broker, and comes back to see whether it may run.
        wait = self.breakers.paused_wait if task in self.breakers.sharing else 0
        entry = attempt.context.handling(attempt.handler).delay_entry
        return hand_back_later(attempt.delivery, attempt.context.now(), wait, entry=entry)

    def after_handle(self, attempt: Attempt, outcome: Outcome | None, error: BaseException | None) -> None:
        if attempt.kind != "run" or outcome is None or attempt.handler is None:
            return
        if isinstance(outcome, Redeliver) and isinstance(outcome.error, OverLimit) and not outcome.error.keyed:
            # Flow control: the handler's limit is reached; what waits over it waits in its queue meanwhile.
            self.breakers.back_off(attempt.handler.task_name, outcome.error.seconds)
        elif isinstance(outcome, Ack):
            if not outcome.duplicate:
                self.breakers.report(attempt.handler.task_name, failed=False)
        elif _unexpected_failure(outcome):
            self.breakers.report(attempt.handler.task_name, failed=True)


def _unexpected_failure(outcome: Outcome) -> bool:
    """Does this outcome count against the handler's breaker? Failures that are retried, or archived for
    running out of retries; not bad input, poison or failures declared permanent."""
    if isinstance(outcome, Redeliver):
        return outcome.why == "retry"
    return isinstance(outcome, SendToArchive) and outcome.reason == Reason.MAX_RETRIES
