"""What a worker of an events app does besides running handlers, as Celery bootsteps (``events_app`` adds
them to its app's ``app.steps``, so they run in workers of that app only).

* :class:`MetricsEndpoint` (worker): with ``amqp_events_metrics_port`` set, the worker's main process
  serves the metrics of every process of the worker (:mod:`amqp_events.metrics.serve`).
* :class:`BreakerState` (worker): the breakers' shared state, made before the pool forks, and their
  middleware added to the app (:mod:`amqp_events.breakers.worker`).
* :class:`BreakerControl` (consumer): pauses and resumes queues for the breakers, and ticks their clocks.
* :class:`Heartbeat` (consumer): every ``amqp_events_heartbeat_interval`` seconds a small heartbeat on
  the ``amqp_events.heartbeats`` fanout exchange, and an ``offline`` one when it stops
  (``amqp-events exporter`` turns them into workers-up metrics).
* :class:`InboxPruning` (consumer): every ``amqp_events_inbox_prune_interval`` seconds, the keys older than
  ``amqp_events_inbox_retention`` leave its handlers' inboxes, in a thread of its own.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/broker/test_breakers.py, tests/broker/test_metrics.py,
tests/broker/test_inbox.py).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from typing import Any

from celery import bootsteps, signals
from kombu import Producer

from amqp_events.breakers.breaker import BreakerPolicy
from amqp_events.breakers.worker import TICK, Breakers, WorkerBreakers
from amqp_events.inbox.prune import prunable_stores, prune
from amqp_events.metrics import AVAILABLE
from amqp_events.metrics.serve import MetricsServer, forget_process
from amqp_events.settings import longest_life_of_a_duplicate
from amqp_events.topology.layout import heartbeats_exchange
from amqp_events.transport.publisher import publishing_user
from amqp_events.wire.heartbeats import heartbeat

logger = logging.getLogger(__name__)


class MetricsEndpoint(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker step: serve ``/metrics`` from the main process (started before the pool forks)."""

    label = "amqp-events metrics endpoint"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.server: MetricsServer | None = None
        settings = parent.app.events_settings
        if not settings.metrics_port:
            return
        if not AVAILABLE:
            logger.error(
                "amqp_events_metrics_port is set but prometheus-client is not installed: pip install '.[metrics]'"
            )
            return
        self.server = MetricsServer(settings.metrics_port, settings.metrics_host)
        signals.worker_process_shutdown.connect(forget_child)

    def start(self, parent: Any) -> None:
        pass

    def stop(self, parent: Any) -> None:
        if self.server is not None:
            signals.worker_process_shutdown.disconnect(forget_child)
            self.server.stop()
            self.server = None

    terminate = shutdown = stop


def forget_child(pid: int | None = None, **_: Any) -> None:
    if pid:
        forget_process(pid)


class BreakerState(bootsteps.Step):  # type: ignore[misc]
    """Worker step: the breakers' state, made before the pool's children fork so that they share it."""

    label = "amqp-events breakers"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        app = parent.app
        context = app.context
        settings = app.events_settings
        default = BreakerPolicy.of(settings.breaker, None)
        # Breakers pause a handler's own queue; ordered handlers share their service's partitions.
        unordered = [handler for handler in context.handlers.values() if not handler.ordered]
        breakers = WorkerBreakers(context.name, unordered, default, app.health_checks, settings.paused_wait)
        app.add_middleware(Breakers(breakers))


def breakers_of(app: Any) -> WorkerBreakers | None:
    """The breakers of this process's worker (:class:`BreakerState` made them), if one runs."""
    found = app.context.middleware.find(Breakers)
    return found.breakers if found is not None else None


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
        if c.host.consumes_in_processes:  # its processes follow the breakers' states themselves
            breakers.start(pause=ignore, resume=ignore)
        else:
            breakers.start(functools.partial(stop_consuming, c), functools.partial(resume_consuming, c))
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


def ignore(queue: str) -> None:
    """The main process of a consuming pool pauses and resumes nothing: it consumes no event queue."""


def stop_consuming(c: Any, queue: str) -> None:
    """Upstream: the consumer's ``task_consumer`` is a kombu ``Consumer`` over every consumed queue."""
    if c.task_consumer is not None:
        c.task_consumer.cancel_by_queue(queue)


def resume_consuming(c: Any, queue: str) -> None:
    """A breaker lets ``queue`` be consumed again: if the worker is to consume it at all. A queue ``-Q``/``-X``
    left out, or that remote control's ``cancel_consumer`` removed, stays unconsumed. Upstream: the worker's
    selection is ``app.amqp.queues.consume_from``, which ``cancel_consumer`` and ``add_consumer`` change."""
    if any(selected.name == queue for selected in c.app.amqp.queues.consume_from.values()):  # 5.5 keys -Q's aliases
        start_consuming(c, queue)


def start_consuming(c: Any, queue: str) -> None:
    task_consumer = c.task_consumer
    if task_consumer is not None and not task_consumer.consuming_from(queue):
        task_consumer.add_queue(c.app.amqp.queues[queue])
        task_consumer.consume()


class Heartbeat(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer step: announce this worker every few seconds on ``amqp_events.heartbeats``."""

    label = "amqp-events heartbeat"
    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        self.timer_entry: Any = None
        self.producer: Producer | None = None
        super().__init__(parent, **kwargs)

    def start(self, c: Any) -> None:
        interval = c.app.events_settings.heartbeat_interval
        channel = c.connection.channel()
        exchange = heartbeats_exchange(c.app.events_settings)
        exchange.declare(channel=channel)
        self.producer = Producer(channel, exchange=exchange)
        self.beat(c, "online")
        self.timer_entry = c.timer.call_repeatedly(interval, self.beat, (c, "online"))

    def stop(self, c: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None
        if self.producer is not None:
            self.beat(c, "offline")
            self.producer = None

    shutdown = stop

    def beat(self, c: Any, state: str) -> None:
        if self.producer is None:
            return
        interval = c.app.events_settings.heartbeat_interval
        breakers = breakers_of(c.app)
        states = (breakers.states(), breakers.health()) if breakers is not None else (None, None)
        body = heartbeat(c.app.service, c.hostname, state, time.time(), *states)
        user = publishing_user(c.connection)
        try:
            self.producer.publish(
                json.dumps(body),
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=1,
                expiration=3 * interval,
                **({"user_id": user} if user else {}),  # verified by the broker: listeners believe it
            )
        except Exception as exc:  # a heartbeat must never stop the worker
            logger.debug("heartbeat not sent: %s", exc)


class InboxPruning(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer step: prune the inboxes (and SQL dedup stores) of this service's handlers now and then."""

    label = "amqp-events inbox pruning"
    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.timer_entry: Any = None
        self.thread: threading.Thread | None = None

    def start(self, c: Any) -> None:
        context = c.app.context
        stores = prunable_stores(context.handlers.values())
        if not stores or self.timer_entry is not None:
            return
        settings = context.settings
        if settings.inbox_retention < longest_life_of_a_duplicate(settings):
            logger.warning(
                "amqp_events_inbox_retention (%gs) is shorter than a duplicate may live (%gs: every retry delay, "
                "then the archive's TTL): a late duplicate would run again",
                settings.inbox_retention,
                longest_life_of_a_duplicate(settings),
            )
        self.timer_entry = c.timer.call_repeatedly(
            settings.inbox_prune_interval, self.prune, (stores, settings.inbox_retention)
        )

    def stop(self, c: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None

    shutdown = stop

    def prune(self, stores: list[Any], retention: float) -> None:
        """Prune in a thread: the event loop must never wait for a database."""
        if self.thread is not None and self.thread.is_alive():
            return
        self.thread = threading.Thread(target=prune, args=(stores, retention), daemon=True, name="amqp-events-prune")
        self.thread.start()
