"""The one way a message a worker took is carried out, whatever took it (Celery's consumer with any pool, the
ordered partitions' consumers, the in-process mode), and whatever host runs it: the host is a
:class:`~amqp_events.dispatch.runtime.Runtime`.

:meth:`Dispatcher.dispatch` routes the message (:func:`amqp_events.core.router.route`), then carries the route out:
a message no handler runs is archived (or copied to each of its handlers, or deferred) by the
:class:`~amqp_events.dispatch.settling.Archiver`; an ordered handler's goes to its key's lane in the ordered runner;
any other runs through the handling pipeline on the executor it is given (the consumer's thread, a thread of a
pool, the worker's coroutine loop), and is then settled. Where the host's own path is needed (Celery's request
path: the prefork pool, whose children run the task; task events; a rate limit; a receiver of Celery's task
signals), the message goes that way instead (a replay batch is split first, its events sent back one by one). An
event whose id the host's remote control revoked is archived (reason ``revoked``) on every path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container
from typing import Any

from amqp_events.core import router
from amqp_events.core.context import ServiceContext
from amqp_events.core.delivery import Answer, Settler
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Ack, Hold, answer_of
from amqp_events.core.router import ToHandler, decoded_delivery
from amqp_events.coroutines import is_coroutine_handler
from amqp_events.dispatch import batches
from amqp_events.dispatch.runtime import Runtime
from amqp_events.dispatch.settling import Archiver
from amqp_events.errors import Revoked
from amqp_events.ordering import intake
from amqp_events.ordering.runner import OrderedRunner
from amqp_events.wire.message import Reason

logger = logging.getLogger(__name__)

#: Runs ``function(handler, message, settler[, held])`` somewhere: now, in a thread, on the coroutine loop.
Executor = Callable[[Callable[..., None], tuple[Any, ...]], None]


def inline(function: Callable[..., None], args: tuple[Any, ...]) -> None:
    function(*args)


class Dispatcher:
    """Carries out the route of each message one host takes (see the module's text).

    ``runtime``: the host. ``executor``/``coroutines``: where plain and coroutine handlers run. ``ordered_runner``:
    the ordered runner, made when first needed. ``revoked``: ids the host's remote control revoked; ``timer``:
    runs a message flow control holds again later (``call_after(seconds, function, args)``; ``None``: none is held),
    and ``on_hold`` is told the queue of each.
    """

    def __init__(
        self,
        context: Callable[[], ServiceContext],
        runtime: Runtime,
        archiver: Archiver,
        ordered_runner: Callable[[], OrderedRunner],
        executor: Executor = inline,
        coroutines: Executor | None = None,
        revoked: Container[str] = (),
        timer: Any = None,
        on_hold: Callable[[str], Any] | None = None,
    ) -> None:
        self.context, self.runtime, self.archiver, self.ordered_runner = context, runtime, archiver, ordered_runner
        self.executor, self.coroutines, self.revoked, self.timer, self.on_hold = (
            executor, coroutines, revoked, timer, on_hold
        )  # fmt: skip

    def dispatch(self, message: Any, queue: str, settler: Settler) -> router.Route:
        """Carry out what becomes of ``message``, taken from ``queue`` (``settler`` settles it on the broker);
        returns its route."""
        context = self.context()
        routed = router.route(context, message, queue)
        if isinstance(routed, ToHandler) and self.revoked and message.headers.get("id") in self.revoked:
            # Celery would ack and drop it; an event is kept, for an operator to replay.
            routed = router.ToArchive(
                Reason.REVOKED, Revoked("its id was revoked (celery control revoke)"), routed.handler
            )
        if not isinstance(routed, ToHandler):
            self.archiver.take(message, settler, routed, queue)
            return routed
        handler = routed.handler
        if handler.ordered:  # to its key's lane: the runner settles it in its turn
            self.ordered_runner().take(intake.pending_of(handler, message, queue, settler, self.runtime.run))
        elif self.runtime.takes_over(handler):
            if routed.batch:  # its events come one by one, as the host's path takes them
                batches.split(context, handler.queue, message, settler)
            else:
                self.runtime.take_over(handler, message)
        else:
            self.executor_of(handler)(self.run_batch if routed.batch else self.run, (handler, message, settler))
        return routed

    def executor_of(self, handler: Handler) -> Executor:
        """Where ``handler`` runs: the coroutine loop for a coroutine handler (where there is one), else the
        executor."""
        on_loop = self.coroutines is not None and is_coroutine_handler(handler.function)
        return self.coroutines if on_loop and self.coroutines is not None else self.executor

    def run(self, handler: Handler, message: Any, settler: Settler, held: bool = False) -> None:
        """Run ``handler`` on ``message`` through the pipeline, then settle it; logged as the host logs a run
        (``held``: it was received before, and held over its limit)."""
        runtime = self.runtime
        delivery = decoded_delivery(message, handler.queue)
        started = time.monotonic()
        if runtime.logs_runs and not held:
            runtime.received(handler, delivery)
        try:
            outcome = runtime.run(handler, delivery, message.delivery_info, self.timer is not None)
        except Exception:  # settling failed (the broker went away): it comes back, counted as a failed attempt
            logger.exception("could not settle %s[%s]", handler.task_name, message.headers.get("id"))
            settler.settle(Answer.REJECT)
            return
        if isinstance(outcome, Hold):  # kept, unacked, and run again later
            if self.on_hold is not None:
                self.on_hold(handler.queue)
            self.timer.call_after(
                outcome.seconds, self.executor_of(handler), (self.run, (handler, message, settler, True))
            )
            return
        settler.settle(answer_of(outcome))
        if runtime.logs_runs and isinstance(outcome, Ack):
            runtime.succeeded(handler, delivery, time.monotonic() - started)

    def run_batch(self, handler: Handler, message: Any, settler: Settler) -> None:
        batches.run_batch(self.context(), handler, message, settler, self.runtime.run)
