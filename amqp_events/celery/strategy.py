"""The strategy of a handler task: how a worker's consumer runs each of its messages.

Upstream: a task's ``Strategy`` (``celery.worker.strategy:default``) turns each
message into a ``Request``, logs it, sends ``task_received``, hands it to the
pool, which traces the run (``task_prerun``/``postrun`` signals, the result
backend, states) and acks it once done. Every step costs, per message, and an
event handler needs none of it: the handling pipeline
(:mod:`amqp_events.core.handling`) decides, settles and records the outcome.

With the solo pool, this strategy runs the pipeline on the message itself, in
the consumer's own thread, then acks (or rejects) it; with the threads pool,
in a thread of the pool, its ack sent back to the consumer's thread; a coroutine
handler's, on the worker's event loop (:mod:`amqp_events.celery.coroutines`). The same
guarantees (acks late, the copy of a retry or an archive confirmed first, a
message the worker loses goes back to the broker) without Celery's
per-message work. Celery's own path is kept whenever something relies on it:
the prefork pool (its children run the task: ``EventHandler.__call__``), task events
(``-E``), a rate limit, a revoked id, a message with an ``eta`` or ``expires``,
or a receiver of Celery's task signals (OpenTelemetry's Celery instrumentation,
say). A history replay's batch of events (:mod:`amqp_events.celery.batches`)
runs here too, each event in turn; on Celery's path it is split first.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/broker/test_celery_compat.py, and every broker test with a solo worker).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import signals
from celery.concurrency.solo import TaskPool as SoloPool
from celery.concurrency.thread import TaskPool as ThreadsPool
from celery.exceptions import Reject
from celery.worker.strategy import default

from amqp_events.celery.batches import batch_runner, splitting
from amqp_events.celery.ordered import ordered_strategy
from amqp_events.celery.received import decoded_delivery
from amqp_events.celery.running import run_here
from amqp_events.coroutines import is_coroutine_handler
from amqp_events.wire.batch import is_batch

logger = logging.getLogger(__name__)

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
#: Headers only Celery's path honours (the library never sets them: delays wait on the broker).
CELERY_ONLY = ("eta", "expires")


def events(task: Any, app: Any, consumer: Any, **options: Any) -> Callable[..., Any]:
    """The strategy of ``task``, a handler task, in ``consumer``'s worker."""
    if task.handler.ordered:
        return ordered_strategy(task, app, consumer)
    celery_path: Callable[..., Any] = splitting(default(task, app, consumer, **options), task, app, consumer)
    pool = consumer.pool
    eventer = consumer.event_dispatcher
    sends_events = bool(eventer and eventer.enabled and task.send_events)
    if not (isinstance(pool, SoloPool | ThreadsPool) and may_bypass_celery_request(task, sends_events)):
        return celery_path
    revoked = consumer.controller.state.revoked
    handle = handler_of(task, app, consumer.hostname, consumer.connection_errors)
    run_batch = batch_runner(task, app, consumer)
    in_a_thread = pool.apply_async if isinstance(pool, ThreadsPool) else None
    if consumer.coroutine_runner is not None and is_coroutine_handler(task.handler.function):
        in_a_thread = consumer.coroutine_runner.submit  # on the worker's event loop, many at a time

    def on_message(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **more: Any) -> Any:
        headers = message.headers
        if needs_celery_request(headers, revoked):
            return celery_path(message, body, ack, reject, callbacks, **more)
        run = run_batch if is_batch(headers) else handle
        if in_a_thread is None:
            run(message, ack, reject)
        else:  # the ack goes back to the consumer's thread (Consumer.call_soon wakes it)
            in_a_thread(run, (message, ack, reject))
        return None

    return on_message


def handler_of(
    task: Any, app: Any, hostname: str, errors: tuple[type[BaseException], ...]
) -> Callable[[Any, Any, Any], None]:
    """Handle one message of ``task`` through the pipeline, then ack or reject it with its promises (which log
    ``errors`` rather than raise them)."""
    handler = task.handler

    def handle(message: Any, ack: Any, reject: Any) -> None:
        delivery = decoded_delivery(message, handler.queue)
        try:
            run_here(app, task, delivery, message.delivery_info, hostname)
        except Reject as exc:  # the handler rejected its message itself
            reject(logger, errors, exc.requeue)
            return
        except Exception:  # settling failed (the broker went away): it comes back, counted as a failed attempt
            logger.exception("could not settle %s[%s]", task.name, message.headers.get("id"))
            reject(logger, errors, False)
            return
        ack(logger, errors)

    return handle


def may_bypass_celery_request(task: Any, sends_events: bool) -> bool:
    """May ``task``'s messages skip Celery's per-message work (nothing configured for the task relies on it)?"""
    return bool(task.acks_late and not task.rate_limit and not sends_events)


def needs_celery_request(headers: Any, revoked: Any) -> bool:
    """Does this message need Celery's own path (a task signal's receiver, a revoked id, ``eta``/``expires``)?"""
    return (
        any(signal.receivers for signal in TASK_SIGNALS)
        or headers.get("id") in revoked
        or any(headers.get(key) for key in CELERY_ONLY)
    )
