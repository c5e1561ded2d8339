"""Circuit breakers in a worker: pause consuming a failing handler's queue, resume after the cool-down.

The state lives in the worker's main process (:class:`WorkerBreakers`):
the process running a handler (a pool child, or the worker itself with the
solo pool) counts each run's outcome in shared memory; the main process
reads the counts twice a second, steps the :mod:`amqp_events.breaker` state
machines, and on a trip cancels the consumer of that handler's queue only;
other handlers go on. The queue's messages stay on the broker, in order.
When the open period ends (or the hold of an operator or a health check is
released) the worker consumes the queue again, half-open.

A message already prefetched when a breaker opened is handed back: a copy
with unchanged counters goes to the end of its queue, then the original is
acked, so it never counts as a failed attempt. The shared arrays are
created before the pool's children fork.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from typing import TYPE_CHECKING, Any

from celery import bootsteps
from celery.worker.control import control_command

from amqp_events.breaker import Breaker, BreakerPolicy, State, Transition
from amqp_events.health import Health, HealthRunner
from amqp_events.metrics import record_breaker, record_health

if TYPE_CHECKING:
    from amqp_events.app import EventsApp
    from amqp_events.handler import EventHandler

logger = logging.getLogger(__name__)

#: Seconds between two looks at the breakers' clocks and the health checks' states.
TICK = 0.1
#: What the pool children read per handler: its breaker's state, and PROBING once a child took the one
#: message a half-open breaker lets through.
PROBING = 3
#: The hold an operator puts on a breaker (``amqp-events breakers open``).
OPERATOR = "operator"


class WorkerBreakers:
    """The breakers of one worker's handlers, and the health checks they depend on."""

    def __init__(self, app: EventsApp) -> None:
        self.app = app
        default = BreakerPolicy.of(app.conf.get("amqp_events_breaker"), None)
        self.handlers: dict[str, EventHandler] = {task.queue_name: task for task in app.event_handlers()}
        policies = {queue: BreakerPolicy.of(task.breaker, default) for queue, task in self.handlers.items()}
        self.breakers = {queue: Breaker(policy or BreakerPolicy()) for queue, policy in policies.items()}
        #: Handlers whose breaker trips on failures (the others only pause when told to).
        self.automatic = {queue for queue, policy in policies.items() if policy is not None}
        self.slots = {queue: index for index, queue in enumerate(sorted(self.handlers))}
        # One byte per handler, its State (or PROBING): written here, read by the pool children (forked later) ...
        self.shared = multiprocessing.RawArray("b", max(1, len(self.slots)))
        # ... and two counters per handler, successes and failures, written by them and read here.
        self.outcomes = multiprocessing.Array("q", 2 * max(1, len(self.slots)))
        self.seen = [0] * (2 * max(1, len(self.slots)))
        self.checks = {check.name: check for check in app.health_checks.values()}
        for task in self.handlers.values():
            unknown = set(task.requires) - set(self.checks)
            if unknown:
                raise ValueError(f"{task.handler_name} requires unknown health check(s): {', '.join(sorted(unknown))}")
        self.consumer: Any = None
        self.runner: HealthRunner | None = None
        self.probing_since: dict[str, float] = {}

    # -- read anywhere (pool children included) ------------------------------------------------------

    def may_run(self, queue: str) -> bool:
        """May a message of ``queue`` run now? Closed: yes; open: no; half-open: the first one only."""
        slot = self.slots.get(queue)
        if slot is None or self.shared[slot] == State.CLOSED:
            return True
        if self.shared[slot] != State.HALF_OPEN:
            return False
        with self.outcomes.get_lock():  # one probe, whichever child asks first
            if self.shared[slot] != State.HALF_OPEN:
                return False
            self.shared[slot] = PROBING
            return True

    def report(self, queue: str, failed: bool) -> None:
        """Count a run of ``queue``'s handler: ``failed`` for an unexpected failure (retried or archived
        for it); called by the process that ran it."""
        slot = self.slots.get(queue)
        if slot is not None and queue in self.automatic:  # only breakers that trip on failures read them
            with self.outcomes.get_lock():
                self.outcomes[2 * slot + failed] += 1

    def states(self) -> dict[str, str]:
        """Each handler's breaker state, by handler name (for heartbeats)."""
        return {self.handlers[queue].handler_name: str(breaker.state) for queue, breaker in self.breakers.items()}

    def health(self) -> dict[str, str]:
        return {name: str(check.state) for name, check in self.checks.items()}

    # -- the main process --------------------------------------------------------------------------

    def start(self, consumer: Any) -> None:
        """The consumer (re)started: stop consuming what is paused; start the health checks once."""
        self.consumer = consumer
        for queue, breaker in self.breakers.items():
            record_breaker(self.app.service, self.handlers[queue].handler_name, breaker.state, tripped=False)
            if breaker.state == State.OPEN:
                self._stop_consuming(queue)
        if self.checks and self.runner is None:
            self.runner = HealthRunner(list(self.checks.values()))
            self.runner.start()

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
            self.runner = None
        self.consumer = None

    def tick(self) -> None:
        """Outcomes reported since the last tick step the breakers; open periods that ended turn
        half-open; health checks hold or release breakers."""
        now = time.monotonic()
        with self.outcomes.get_lock():
            counts = self.outcomes[:]
        for queue, slot in self.slots.items():
            successes, failures = (counts[2 * slot + n] - self.seen[2 * slot + n] for n in (0, 1))
            self.seen[2 * slot], self.seen[2 * slot + 1] = counts[2 * slot], counts[2 * slot + 1]
            if queue in self.automatic:  # successes first: a failure among them decides a half-open probe
                for failed in [False] * successes + [True] * failures:
                    self._apply(queue, self.breakers[queue].record(failed, now))
        for name, check in self.checks.items():
            record_health(self.app.service, name, check.state.gauge)
        for queue, breaker in self.breakers.items():
            task = self.handlers[queue]
            for name in task.requires:
                reason = f"health check {name} unhealthy"
                if self.checks[name].state == Health.UNHEALTHY:
                    self._apply(queue, breaker.hold(reason))
                else:
                    self._apply(queue, breaker.release(reason, now))
            self._apply(queue, breaker.poll(now))
            self._unless_probe_lost(queue, now)

    def _unless_probe_lost(self, queue: str, now: float) -> None:
        """A probe whose outcome never came (its process died): let another message probe."""
        slot = self.slots[queue]
        if self.shared[slot] != PROBING:
            self.probing_since.pop(queue, None)
        elif now - self.probing_since.setdefault(queue, now) > self.breakers[queue].policy.window:
            self.probing_since.pop(queue)
            self.shared[slot] = State.HALF_OPEN

    def hold(self, handler: str, reason: str = OPERATOR) -> list[str]:
        """Hold the breakers of the handlers named ``handler`` (function name, full name or event) open."""
        return [queue for queue in self.matching(handler) if self._apply(queue, self.breakers[queue].hold(reason))]

    def release(self, handler: str, reason: str = OPERATOR) -> list[str]:
        now = time.monotonic()
        return [
            queue for queue in self.matching(handler) if self._apply(queue, self.breakers[queue].release(reason, now))
        ]

    def matching(self, handler: str) -> list[str]:
        """Queues of the handlers called ``handler``: the function's name, its full name, or the event."""
        return [
            queue
            for queue, task in self.handlers.items()
            if handler in (task.handler_name, task.handler_name.rsplit(".", 1)[-1], task.name)
        ]

    def _apply(self, queue: str, transition: Transition | None) -> bool:
        if transition is None:
            return False
        if transition.state == State.HALF_OPEN and queue not in self.automatic:  # no failures to watch for
            transition = self.breakers[queue].close(transition.why)
        task = self.handlers[queue]
        self.shared[self.slots[queue]] = transition.state
        # Structured fields, as on the lines about events (amqp_events.logs).
        fields = {"service": self.app.service, "handler": task.handler_name, "breaker": transition.state.name.lower()}
        if transition.state == State.OPEN:
            self._stop_consuming(queue)
            more = f"; resuming in {transition.open_for:g}s" if transition.open_for else ""
            logger.log(
                max(transition.level, logging.WARNING),
                "breaker of %s opened (%s): its queue %s is not consumed%s",
                task.handler_name, transition.why, queue, more, extra=fields,
            )  # fmt: skip
        else:
            self._start_consuming(queue)
            state, why = transition.state, transition.why
            logger.info("breaker of %s %s (%s): consuming %s", task.handler_name, state, why, queue, extra=fields)
        tripped = transition.state == State.OPEN and bool(transition.open_for)
        record_breaker(self.app.service, task.handler_name, transition.state, tripped)
        return True

    def _stop_consuming(self, queue: str) -> None:
        consumer = self.consumer
        if consumer is not None and consumer.task_consumer is not None:
            consumer.task_consumer.cancel_by_queue(queue)

    def _start_consuming(self, queue: str) -> None:
        consumer = self.consumer
        if consumer is None or consumer.task_consumer is None:
            return
        task_consumer = consumer.task_consumer
        if not task_consumer.consuming_from(queue):
            task_consumer.add_queue(self.app.amqp.queues[queue])
            task_consumer.consume()


def breakers_of(app: Any) -> WorkerBreakers | None:
    """The breakers of the worker running in this process (a pool child's included), if one runs."""
    return getattr(app, "worker_breakers", None)


class BreakerState(bootsteps.Step):  # type: ignore[misc]
    """Worker step: create the breakers' state before the pool's children fork, so that they share it."""

    label = "amqp-events breakers"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        parent.app.worker_breakers = WorkerBreakers(parent.app)


class BreakerControl(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer step: apply pauses to the (re)started consumer and look at the breakers' clocks."""

    label = "amqp-events breaker control"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.timer_entry: Any = None

    def start(self, c: Any) -> None:
        breakers = breakers_of(c.app)
        if breakers is None:
            return
        breakers.start(c)
        if self.timer_entry is None:
            self.timer_entry = c.timer.call_repeatedly(TICK, breakers.tick)

    def stop(self, c: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        breakers = breakers_of(c.app)
        if breakers is not None:
            breakers.stop()


@control_command(  # type: ignore[untyped-decorator]  # celery is untyped
    args=[("service", str), ("handler", str), ("action", str)],
    signature="<service> <handler> <open|close>",
)
def amqp_events_breaker(state: Any, service: str, handler: str, action: str) -> dict[str, Any]:
    """Remote control (``amqp-events breakers open|close``): hold a handler's breaker open, or release it.

    Every worker on the vhost receives the broadcast; those of other services ignore it.
    """
    app = state.consumer.app
    breakers = breakers_of(app)
    if getattr(app, "service", None) != service or breakers is None:
        return {"service": getattr(app, "service", None), "matched": []}
    matched = breakers.matching(handler)
    if action == "open":
        breakers.hold(handler)
    elif action == "close":
        breakers.release(handler)
    else:
        return {"service": service, "error": f"unknown action {action!r} (open or close)"}
    names = [breakers.handlers[queue].handler_name for queue in matched]
    return {"service": service, "matched": names, "action": action}
