"""Coroutine handlers in a solo or threads worker: the worker's event loop, fed by the consumer, its acks sent
back to the consumer's thread.

The dispatcher (:mod:`amqp_events.celery.dispatch`) hands each message of a coroutine handler to
:meth:`CoroutineRunner.submit`; its pipeline runs on the worker's loop (:class:`~amqp_events.coroutines.
WorkerLoop`), ``amqp_events_async_concurrency`` at a time. Acks and rejects must be sent from the consumer's
thread (a channel is not thread-safe): they queue here and the consumer's event loop, woken, sends them. The
prefetch is raised so that the broker keeps that many messages in hand (:mod:`amqp_events.celery.prefetch`).

A warm shutdown waits up to ``amqp_events_async_shutdown_timeout`` seconds for the running ones, sends their
acks, and cancels the rest: they go back to the broker unacked when the connection closes. Under prefork each
child runs its coroutines one at a time to completion; gevent (and eventlet) workers refuse coroutine handlers.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from amqp_events.core.delivery import Settler
from amqp_events.coroutines import Mailbox, WorkerLoop

logger = logging.getLogger(__name__)
#: Seconds a thread may hold the GIL while another waits for it, in a worker running coroutine handlers.
SWITCH_INTERVAL = 0.001


class CoroutineRunner:
    """Runs the messages of a consumer's coroutine handlers on the worker's loop."""

    def __init__(self, consumer: Any, concurrency: int, shutdown_timeout: float) -> None:
        self.consumer = consumer
        self.shutdown_timeout = shutdown_timeout
        self.worker_loop = WorkerLoop(concurrency)
        # Acks and rejects for the consumer's thread (a channel is not thread-safe).
        self._settled: Mailbox[Callable[[], Any]] = Mailbox(consumer.call_soon, _call)
        # The consumer's thread needs the GIL back after each socket read while the loop's thread runs pipelines;
        # CPython's 5 ms switch interval makes it wait that long (measured in bench/: 0.68x the plain handler's
        # drain with 5 ms, 0.80x with 1 ms; 0.1 ms costs more than it saves).
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        self.worker_loop.start()

    def submit(self, run: Callable[..., None], args: tuple[Any, Any, Settler]) -> None:
        """Run ``run(task, message, settler)`` on the loop, its answers given in the consumer's thread (the
        threads pool's ``apply_async`` signature)."""
        task, message, settler = args
        self.worker_loop.spawn(run, (task, message, Posted(settler, self._settled.put)))

    def stop(self) -> None:
        given_back = self.worker_loop.stop(self.shutdown_timeout)
        self._settled.take_all()  # the acks of the pipelines that finished meanwhile
        if given_back:
            logger.warning(
                "%d coroutine handler(s) still running after %s s of warm shutdown were cancelled: their "
                "messages go back to the broker unacked",
                given_back,
                self.shutdown_timeout,
            )


def _call(settle: Callable[[], Any]) -> None:
    settle()


class Posted:
    """A settler whose answers are posted, to be given by ``settler`` in the consumer's thread."""

    __slots__ = ("post", "settler")

    def __init__(self, settler: Settler, post: Callable[[Callable[[], Any]], None]) -> None:
        self.settler, self.post = settler, post

    def ack(self) -> None:
        self.post(self.settler.ack)

    def requeue(self) -> None:
        self.post(self.settler.requeue)

    def reject(self) -> None:
        self.post(self.settler.reject)


def runs_on_its_loop(pool: Any) -> bool:
    """Does a worker with ``pool`` run coroutine handlers on a loop of its own (solo and threads)? Prefork's
    children run each to completion; gevent refuses them."""
    return type(pool).__module__ in ("celery.concurrency.solo", "celery.concurrency.thread")
