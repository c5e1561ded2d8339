"""Coroutine handlers in a solo or threads worker (and each process of the consuming pool): the worker's event
loop, stepped by the consumer's.

The dispatcher (:mod:`amqp_events.dispatch.dispatcher`) hands each message of a coroutine handler to
:meth:`CoroutineRunner.submit`; its pipeline runs on the worker's loop (:class:`~amqp_events.coroutines.
WorkerLoop`), ``amqp_events_async_concurrency`` at a time. That loop has no thread: the consumer's event loop
(kombu's hub) steps it in its own thread, before each poll while callbacks are due, when one of its sockets
is readable (its selector's descriptor is one of the hub's readers) and at a hub timer set for its earliest
timer. So acks go straight to the channel from the thread that owns it. The prefetch is raised so that the
broker keeps that many messages in hand (:mod:`amqp_events.celery.prefetch`).

When the consumer stops, a warm shutdown runs the loop in the consumer's thread for up to
``amqp_events_async_shutdown_timeout`` seconds while the running ones finish (their acks sent at once), and
cancels the rest: they go back to the broker unacked when the connection closes. The loop then has a thread
of its own for the threads that still wait on it. Under ``-P prefork`` each child runs its coroutines one at a
time to completion; gevent (and eventlet) workers refuse coroutine handlers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from amqp_events.coroutines import WorkerLoop

logger = logging.getLogger(__name__)
#: Steps of the loop in a row at most, before the hub polls its sockets again (woken at once if more is due).
STEPS_IN_A_ROW = 4


class CoroutineRunner:
    """Runs the messages of a consumer's coroutine handlers on the worker's loop, stepped by ``hub``
    (``wake()`` ends the hub's poll at once); without a hub, the loop runs in a thread of its own."""

    def __init__(self, hub: Any, wake: Callable[[], Any], concurrency: int, shutdown_timeout: float) -> None:
        self.hub, self.wake = hub, wake
        self.shutdown_timeout = shutdown_timeout
        self.worker_loop = WorkerLoop(concurrency)
        self.worker_loop.start()
        self._fd = self.worker_loop.selector_fd
        self._timer: Any = None  # the hub's timer entry for the loop's earliest timer
        self._timer_at: float | None = None  # ... and when it falls due
        self._finished = False
        if hub is None:
            self.worker_loop.hand_over()

    def submit(self, run: Callable[..., None], args: tuple[Any, ...]) -> None:
        """Run ``run(task, message, settler)`` on the loop (the threads pool's ``apply_async`` signature)."""
        self.worker_loop.spawn(run, args)

    def before_poll(self) -> None:
        """In the hub's tick, before it polls: steps while callbacks are due, then makes sure the hub wakes for
        the loop's sockets and its next timer. The hub computed its poll's timeout before this tick (kombu fires
        its timers first), so a new earlier timer, or more due, wakes it."""
        if self._finished or self.worker_loop.handed_over:
            return
        if self._run_due(False) or self.worker_loop.due():
            self.wake()

    def loop_started(self) -> None:
        """The hub starts (again, on a new connection), in the thread that steps the loop from now on. Its reset
        dropped its readers, and Celery 5.5 and 5.6 clear its timers: the loop's are set again."""
        self.worker_loop.drive_from_here()
        if self._finished or self.worker_loop.handed_over:
            return
        if self._fd not in self.hub.readers:
            self.hub.add_reader(self._fd, self._run_due, True)
        self._timer_at = None

    def _run_due(self, readable: bool) -> bool:
        """Steps the loop (once at least when ``readable``, or a timer fell due), up to :data:`STEPS_IN_A_ROW`
        times; then a hub timer for the loop's earliest. Returns whether that timer is new."""
        loop = self.worker_loop
        for _ in range(STEPS_IN_A_ROW):
            if not (readable or loop.due()):
                break
            readable = False
            loop.step()
        return self._arm(loop.next_deadline())

    def _arm(self, deadline: float | None) -> bool:
        """A hub timer at the loop's earliest ``deadline``, unless one no later is still ahead."""
        if deadline is None:
            return False
        now = self.worker_loop.loop.time()  # time.monotonic(), as the hub's timer
        if self._timer_at is not None and now < self._timer_at <= deadline:
            return False
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.hub.call_later(max(deadline - now, 0.0), self._run_due, True)
        self._timer_at = deadline
        return True

    def finish(self) -> None:
        """The consumer stops, and its hub steps the loop no more: the running pipelines go on in this (the
        consumer's) thread for up to the shutdown timeout, their acks sent at once; the rest are cancelled.
        Then the loop runs in a thread of its own for the threads that wait on it (a threads pool stopping, an
        ordered runner), which stop after the consumer."""
        if self._finished:
            return
        self._finished = True
        if self.hub is not None:
            with contextlib.suppress(Exception):  # the hub may be closed already
                self.hub.remove_reader(self._fd)
            if self._timer is not None:
                self._timer.cancel()
        given_back = self.worker_loop.finish(self.shutdown_timeout)
        if given_back:
            logger.warning(
                "%d coroutine handler(s) still running after %s s of warm shutdown were cancelled: their "
                "messages go back to the broker unacked",
                given_back,
                self.shutdown_timeout,
            )

    def stop(self) -> None:
        self.finish()
        self.worker_loop.stop()
