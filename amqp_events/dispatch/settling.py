"""How a worker's answer about a message reaches the broker: ack, requeue or reject on the message's own channel
(:class:`ChannelSettler`), and, for what the router does not run, the copy it needs confirmed first
(:class:`Archiver`: to the archive, a copy for each handler, a deferral on the delay ladder).

A channel is not thread-safe: an answer given in another thread (the threads pool's, the coroutine loop's, the
ordered runner's) is sent from the consumer's thread, which is woken for it. If publishing a copy fails, it is
tried again on a short schedule, then the message goes back to its queue: never dropped, never held for good.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from amqp_events.core import handling
from amqp_events.core.context import ServiceContext
from amqp_events.core.delivery import Answer, Settler
from amqp_events.core.publishing import describe, publish_routed
from amqp_events.core.router import Copies, Defer, ToArchive, archived_delivery
from amqp_events.errors import AlreadySettled
from amqp_events.wire.message import OutgoingMessage

logger = logging.getLogger(__name__)

#: Seconds between attempts to publish the copy of a message the worker does not run; after the last, the message
#: goes back to its queue.
ARCHIVE_RETRY_DELAYS = (1.0, 2.0, 4.0)


class ChannelSettler:
    """Settles ``message`` (a kombu message) on its channel, once: a second answer raises
    :class:`~amqp_events.errors.AlreadySettled` where it is given. An answer given in a thread other than the
    consumer's is handed to ``post`` (the consumer's ``call_soon``), to be sent from it. ``never_hold`` marks a
    message whose ack its channel must not hold (:mod:`amqp_events.transport.acks`): a replaced message's."""

    __slots__ = ("answer", "message", "never_hold", "post", "thread")

    def __init__(
        self, message: Any, post: Callable[..., Any] | None = None, never_hold: Callable[[Any], None] | None = None
    ) -> None:
        self.message, self.post, self.never_hold, self.thread = message, post, never_hold, threading.get_ident()
        #: The answer given ("" until then).
        self.answer = ""

    def settle(self, answer: Answer) -> None:
        if self.answer:
            event_id = (getattr(self.message, "headers", None) or {}).get("id")
            raise AlreadySettled(f"message {event_id!r} was {self.answer}; it cannot be {answer.value} as well")
        self.answer = answer.value
        if answer is Answer.ACK_REPLACED and self.never_hold is not None:  # one callback: kombu's hub runs those
            self._send(_ack_unheld, self.message, self.never_hold)  # posted in any order
        elif answer is Answer.ACK or answer is Answer.ACK_REPLACED:
            self._send(self.message.ack)
        else:
            self._send(self.message.reject, answer is Answer.REQUEUE)

    def _send(self, answer: Callable[..., Any], *args: Any) -> None:
        if self.post is not None and threading.get_ident() != self.thread:
            self.post(_logged, answer, *args)
        else:
            _logged(answer, *args)


def _ack_unheld(message: Any, never_hold: Callable[[Any], None]) -> None:
    never_hold(message)
    message.ack()


def _logged(answer: Callable[..., Any], *args: Any) -> None:
    """Send an answer; one the channel cannot take (it closed) is logged: the broker has the message back."""
    try:
        answer(*args)
    except Exception as exc:
        logger.warning("could not settle a message (%s): the broker gets it back with its channel", describe(exc))


def _publish_all(copies: list[OutgoingMessage], context: ServiceContext) -> None:
    for copy in copies:
        publish_routed(context, copy)


class Archiver:
    """Carries out a route that runs nothing: its copy published (confirmed), then the original acked; on the
    consumer's event loop (``timer`` tries a failed publish again)."""

    def __init__(self, context: Callable[[], ServiceContext], timer: Any) -> None:
        self.context, self.timer = context, timer

    def take(self, message: Any, settler: Settler, route: ToArchive | Copies | Defer, queue: str = "") -> None:
        """Publish what ``route`` needs for ``message`` (taken from ``queue``), then ack it."""
        if isinstance(route, ToArchive):
            reason, error, handler = route.reason, route.error, route.handler

            def archive(context: ServiceContext) -> Any:
                delivery = archived_delivery(message, context.name, queue)
                return handling.archive_refused(context, delivery, reason, error, handler)

            self._settle(message, settler, archive, 0, f"{reason}, ")
        elif isinstance(route, Copies):
            self._settle(message, settler, functools.partial(_publish_all, route.messages), 0, "copies, ")
        else:
            delivery, delay = route.delivery, route.delay
            self._settle(message, settler, lambda context: handling.defer(context, delivery, delay), 0)

    def _settle(
        self, message: Any, settler: Settler, publish: Callable[[ServiceContext], Any], attempt: int, why: str = ""
    ) -> None:
        context = self.context()
        try:
            publish(context)
        except Exception as exc:
            about = f"a message of service {context.name!r} ({why}id {(message.headers or {}).get('id')!r})"
            self._failed(message, settler, publish, attempt, exc, about)
            return
        settler.settle(Answer.ACK_REPLACED)

    def _failed(
        self,
        message: Any,
        settler: Settler,
        publish: Callable[[ServiceContext], Any],
        attempt: int,
        exc: Exception,
        about: str,
    ) -> None:
        if attempt < len(ARCHIVE_RETRY_DELAYS):
            delay = ARCHIVE_RETRY_DELAYS[attempt]
            logger.warning("could not archive %s: %s; trying again in %gs", about, describe(exc), delay)
            self.timer.call_after(delay, self._settle, (message, settler, publish, attempt + 1))
            return
        logger.error("could not archive %s: %s; returning it to its queue", about, describe(exc))
        settler.settle(Answer.REQUEUE)
