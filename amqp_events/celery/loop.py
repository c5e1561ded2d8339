"""Adjustments of the worker's event loop (kombu's hub): acks sent at once (or never held), a poll ended at once,
what other threads queued run before the consumer's steps stop.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 with kombu 5.5.4, 5.6.2 and 5.7.0 (tests/broker/test_celery_compat.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

from amqp_events.wire.message import LOST_RUNS

logger = logging.getLogger(__name__)


def acks_now(make_promise: Callable[..., Any], deferred: Iterable[Any]) -> Callable[..., Any]:
    """A ``promise`` factory for ``Consumer.create_task_handler`` whose ack/reject callbacks run at once.

    Upstream: the task handler wraps ``message.ack``/``reject`` in promises of
    ``Consumer.call_soon`` (5.5, 5.6) or ``call_soon_ack`` (5.7), which queue
    them for the event loop's next turn. With the solo pool the task ran inside
    this turn, and the next one may first sit in ``poll()`` for up to 10 s: once
    the prefetch window is full the broker sends nothing to wake it. The solo
    pool runs on the loop's own thread, so the ack can be sent right away.
    """
    later = {callback for callback in deferred if callback is not None}

    def make(fun: Any = None, args: Any = None, *rest: Any, **options: Any) -> Any:
        return make_promise(call_now if fun in later else fun, args, *rest, **options)

    return make


def call_now(callback: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        callback(*args, **kwargs)
    except Exception:
        logger.exception("could not ack or reject a message")


def run_queued(hub: Any) -> None:
    """Run now what other threads queued on the worker's event loop (``hub.call_soon``), as its next turn would.

    Upstream (kombu 5.5-5.7): once the worker stops, the loop turns no more; the hub runs what is queued when it
    closes, after the consumer's steps stopped. By then the partitions' channels are closed, and the acks of
    their messages, given in an ordered lane's thread, would be refused (the messages run again).
    """
    for callback in hub._pop_ready():
        if callback:
            call_now(callback)


class LoopWaker:
    """A pipe in the worker's event loop: writing to it ends the loop's current poll at once."""

    def __init__(self, hub: Any) -> None:
        self.hub = hub
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        hub.add_reader(self.read_fd, self._drain)

    def keep_reading(self) -> None:
        """Read again by the hub after a ``hub.reset()`` (which drops every reader)."""
        if self.read_fd not in self.hub.readers:
            self.hub.add_reader(self.read_fd, self._drain)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe has a wake-up pending already
            os.write(self.write_fd, b"\0")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.hub.remove_reader(self.read_fd)
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            os.read(self.read_fd, 4096)


def acked_unheld(handle: Callable[[Any], Any], never_hold: Callable[[Any], None]) -> Callable[[Any], Any]:
    """``handle`` (Celery's request path): whether a run's copy replaced its message is not known when Celery acks
    it, so the ack of a message that may be counted as a lost run (the broker gave it back, or it carries lost
    runs: its copy, published at once, would be the next delivery) is never held (``never_hold``). Holding
    every one would cost a frame and a settlement per message."""

    def unheld(message: Any) -> Any:
        if (message.delivery_info or {}).get("redelivered") or LOST_RUNS in (message.headers or {}):
            never_hold(message)
        return handle(message)

    return unheld
