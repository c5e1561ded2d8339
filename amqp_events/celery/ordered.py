"""How a Celery worker gives its ordered handlers' messages to the ordered runner
(:class:`~amqp_events.ordering.runner.OrderedRunner`, one per consumer): in the consumer's own thread with the solo
pool, otherwise in a thread pool of the worker's main process as large as the worker's concurrency (prefork
children never run them: a lane must know when its message is done).

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/broker/test_ordered.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from amqp_events.ordering.runner import OrderedRunner
from amqp_events.ordering.timers import Timers

logger = logging.getLogger(__name__)


class WorkerExecutor:
    """Where a worker's runner runs messages: a thread pool, or (solo) the consumer's thread; held retries wait
    on timers of their own thread."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.loop_thread = threading.get_ident()
        pool = consumer.pool
        self.threads = (
            None
            if consumer.host.runs_in_the_consumers_thread
            else ThreadPoolExecutor(max_workers=max(1, pool.limit or 1), thread_name_prefix="amqp-events-ordered")
        )
        self.timers = Timers()

    def submit(self, call: Callable[[], None]) -> None:
        if self.threads is not None:
            self.threads.submit(call)
        elif threading.get_ident() == self.loop_thread:
            call()
        else:  # a held retry's timer: back to the event loop's thread, where solo runs everything
            self.consumer.call_soon(call)

    def call_after(self, seconds: float, call: Callable[[], None], tag: str) -> None:
        self.timers.call_after(seconds, call, tag)

    def cancel(self, tag: str | None = None) -> None:
        self.timers.cancel(tag)

    def stop(self) -> None:
        self.timers.stop()
        if self.threads is not None:
            self.threads.shutdown(wait=True, cancel_futures=True)


def runner_of(app: Any, consumer: Any) -> OrderedRunner:
    """The runner of ``consumer``, made on first use."""
    runner: OrderedRunner | None = getattr(consumer, "ordered_runner", None)
    if runner is None:
        runner = consumer.ordered_runner = OrderedRunner(lambda: app.context, WorkerExecutor(consumer))
    return runner
