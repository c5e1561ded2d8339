"""The one way a message a worker took is carried out, whatever took it: Celery's consumer with any pool, the
ordered partitions' consumers, the in-process mode.

:meth:`Dispatcher.dispatch` routes the message (:func:`amqp_events.core.router.route`), then carries the route out:
a message no handler runs is archived (or copied to each of its handlers, or deferred) by the
:class:`~amqp_events.celery.settling.Archiver`; an ordered handler's goes to its key's lane in the ordered runner;
any other runs through the handling pipeline here, in the consumer's thread (solo), a thread of the threads pool or
the worker's coroutine loop, and is then settled. Where something configured relies on Celery's own request path
(the prefork pool, whose children run the task; task events; a rate limit; a receiver of Celery's task signals),
the message goes that way instead (a replay batch is split first, its events sent back one by one). An event whose
id Celery's remote control revoked is archived (reason ``revoked``) on every path.

Upstream: a task's ``Strategy`` (``celery.worker.strategy:default``) turns each message into a ``Request``, logs
it, sends ``task_received`` and hands it to the pool, which traces the run (signals, states) and acks it once done.
Each step costs, per message, and an event handler needs none of it. Checked on Celery 5.5.3, 5.6.3 and 5.7.0
(tests/broker/test_celery_compat.py, and every broker test with a solo or threads worker).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Container
from typing import Any

from celery import signals
from celery.exceptions import Reject
from celery.utils.saferepr import saferepr
from kombu import compression

from amqp_events.celery import batches, ordered
from amqp_events.celery.running import run_here
from amqp_events.celery.settling import Archiver
from amqp_events.core import router
from amqp_events.core.delivery import Answer, Settler
from amqp_events.core.outcome import Ack, Hold, RejectedByHandler, answer_of
from amqp_events.core.router import Run, decoded_delivery
from amqp_events.coroutines import is_coroutine_handler
from amqp_events.errors import Revoked
from amqp_events.ordering.runner import OrderedRunner
from amqp_events.wire import limits
from amqp_events.wire.message import Reason

logger = logging.getLogger(__name__)
#: Celery's own loggers of a run's start and end (``-l info``), as its request path and trace use them.
received_logger = logging.getLogger("celery.worker.strategy")
trace_logger = logging.getLogger("celery.app.trace")
#: How much of the arguments a task event shows (Celery's own default, ``argsrepr_maxsize``).
ARGSREPR = 1024

#: Celery's task signals: a receiver of any of them gets Celery's own path.
TASK_SIGNALS = (
    signals.task_received,
    signals.before_task_publish,
    signals.task_prerun,
    signals.task_postrun,
    signals.task_success,
    signals.task_failure,
    signals.task_retry,
    signals.task_revoked,
)
#: Runs ``function(task, message, settler[, held])`` somewhere: now, in a thread, on the coroutine loop.
Executor = Callable[[Callable[..., None], tuple[Any, ...]], None]


def inline(function: Callable[..., None], args: tuple[Any, ...]) -> None:
    function(*args)


class Dispatcher:
    """Carries out the route of each message one host takes (see the module's text).

    ``celery_path``: hands a message to Celery's own request path (``None``: there is none, every message runs
    here). ``executor``/``coroutines``: where plain and coroutine handlers run. ``ordered``: the ordered runner,
    made when first needed. ``revoked``: ids Celery's remote control revoked; ``bypass``: may messages skip
    Celery's request path at all (not with the prefork pool); ``events``: are task events on (``-E``); ``timer``:
    runs a message flow control holds again later (``call_after(seconds, function, args)``; ``None``: none is held),
    and ``on_hold`` is told the queue of each (:mod:`amqp_events.celery.limited_queues`).
    """

    def __init__(
        self,
        app: Any,
        archiver: Archiver,
        ordered_runner: Callable[[], OrderedRunner],
        hostname: str,
        celery_path: Callable[[Any], Any] | None = None,
        executor: Executor = inline,
        coroutines: Executor | None = None,
        revoked: Container[str] = (),
        bypass: bool = True,
        events: bool = False,
        timer: Any = None,
        on_hold: Callable[[str], Any] | None = None,
    ) -> None:
        self.app, self.archiver, self.ordered_runner, self.hostname = app, archiver, ordered_runner, hostname
        self.celery_path, self.executor, self.coroutines = celery_path, executor, coroutines
        self.revoked, self.bypass, self.events, self.timer, self.on_hold = revoked, bypass, events, timer, on_hold
        self.log_runs = app.context.settings.log_runs

    def dispatch(self, message: Any, queue: str, settler: Settler) -> router.Route:
        """Carry out what becomes of ``message``, taken from ``queue`` (``settler`` settles it on the broker);
        returns its route."""
        routed = router.route(self.app.context, message, queue)
        if isinstance(routed, Run) and self.revoked and message.headers.get("id") in self.revoked:
            # Celery would ack and drop it; an event is kept, for an operator to replay.
            routed = router.Archive(
                Reason.REVOKED, Revoked("its id was revoked (celery control revoke)"), routed.handler
            )
        if not isinstance(routed, Run):
            self.archiver.take(message, settler, routed, queue)
            return routed
        handler = routed.handler
        task = self.app.tasks[handler.task_name]
        if handler.ordered:  # to its key's lane: the runner settles it in its turn
            held = ordered.pending_of(self.app, task, message, queue, settler, self.hostname)
            if held is not None:
                self.ordered_runner().take(held)
        elif self.celery_path is not None and self.needs_celery(task):
            if routed.batch:  # its events come one by one, as Celery's path takes them
                batches.split(self.app.context, handler.queue, message, settler)
            else:
                if self.events:  # what its task events show of the arguments, as Celery's own sender writes it
                    args, kwargs, _ = message.decode()
                    message.headers.update(argsrepr=saferepr(args, ARGSREPR), kwargsrepr=saferepr(kwargs, ARGSREPR))
                self.celery_path(message)
        else:
            self.executor_of(handler)(self.run_batch if routed.batch else self.run, (task, message, settler))
        return routed

    def executor_of(self, handler: Any) -> Executor:
        """Where ``handler`` runs: the coroutine loop for a coroutine handler (where there is one), else the
        executor."""
        on_loop = self.coroutines is not None and is_coroutine_handler(handler.function)
        return self.coroutines if on_loop and self.coroutines is not None else self.executor

    def needs_celery(self, task: Any) -> bool:
        """Does ``task``'s message need Celery's own request path (see the module's text)?"""
        events = self.events and task.send_events
        bypassed = self.bypass and task.acks_late and not task.rate_limit and not events
        return not bypassed or any(signal.receivers for signal in TASK_SIGNALS)

    def run(self, task: Any, message: Any, settler: Settler, held: bool = False) -> None:
        """Run ``task``'s handler on ``message`` through the pipeline, then settle it; with Celery's lines at
        ``-l info``, as its own request path logs them (``held``: it was received before, and held over its
        limit)."""
        delivery = decoded_delivery(message, task.handler.queue)
        logged = self.log_runs and received_logger.isEnabledFor(logging.INFO)
        started = time.monotonic()
        if logged and not held:
            received_logger.info("Task %s[%s] received", task.name, delivery.event_id)
        try:
            info, hold = message.delivery_info, self.timer is not None
            outcome = run_here(self.app, task, delivery, info, self.hostname, hold)
        except Reject as exc:  # the handler rejected its message itself
            settler.settle(answer_of(RejectedByHandler(bool(exc.requeue))))
            return
        except Exception:  # settling failed (the broker went away): it comes back, counted as a failed attempt
            logger.exception("could not settle %s[%s]", task.name, message.headers.get("id"))
            settler.settle(Answer.REJECT)
            return
        if isinstance(outcome, Hold):  # kept, unacked, and run again later
            if self.on_hold is not None:
                self.on_hold(task.handler.queue)
            self.timer.call_after(
                outcome.seconds, self.executor_of(task.handler), (self.run, (task, message, settler, True))
            )
            return
        settler.settle(answer_of(outcome))
        if logged and isinstance(outcome, Ack):
            runtime = time.monotonic() - started
            trace_logger.info("Task %s[%s] succeeded in %ss: %s", task.name, delivery.event_id, runtime, None)

    def run_batch(self, task: Any, message: Any, settler: Settler) -> None:
        batches.run_batch(self.app, task, message, settler, self.hostname)


def install_limits(max_body: int = limits.MAX_BODY) -> None:
    """Bound what a worker reads before the router sees a message: kombu's decompression (a zlib bomb stops at
    ``max_body``; compressions without a bound are not read) and, on Python 3.11+, whose calls between Python
    functions take no C stack, the recursion py-amqp needs to read the deepest headers a frame can hold (they are
    then refused as malformed, instead of stopping the consumer). Once per worker process."""
    bounded = limits.bounded_decoders(max_body)
    # Upstream (kombu 5.5-5.7): decoders are kept by content type in this table; register() replaces both ways.
    for content_type in list(compression._decoders):
        decoder = bounded.get(content_type) or limits.unsupported(content_type)
        compression._decoders[content_type] = decoder
    if sys.version_info >= (3, 11):
        sys.setrecursionlimit(max(sys.getrecursionlimit(), limits.DECODING_RECURSION))
