"""A limited handler's queue, consumed only as far as its events can start.

A handler given ``concurrency=`` or ``rate_limit=`` (without a key) has a queue of its own (the ``per_handler``
layout). It is consumed with a prefetch of the runs the process makes at once (one on the default pool and ``-P
solo``) while its events wait for their limit (flow control holds them: :class:`~amqp_events.core.outcome.Hold`):
the backlog then stays on the broker, in the queue's order, and each process holds one event at most, the next to
start, instead of a prefetch's worth that another process might have run. A queue starts so; after
:data:`WIDEN_AFTER` events in a row that did not wait it is consumed at the worker's prefetch, so that a fast handler
far below its limit runs at full speed, and again narrowly from the next wait on (what the process took meanwhile
waits in it, in the order taken).

RabbitMQ gives a consumer the per-consumer prefetch (``basic.qos`` with ``global=False``) set when it starts, so
the queue's consumer is cancelled and started again; what it had delivered stays with the process, and a message
still on its way under the old consumer tag is known by it (:mod:`amqp_events.celery.tags`). A limit per key keeps
the worker's prefetch: the other keys' events go on past those held (:mod:`amqp_events.limits.waiting`).

Checked on RabbitMQ 3.10 and 4.0 (tests/broker/test_flow_waiting.py).
"""

from __future__ import annotations

import logging
from typing import Any

from amqp_events.limits.waiting import keyed_limit, limited_prefetch

logger = logging.getLogger(__name__)

#: Events in a row that did not wait after which a limited queue is consumed at the worker's prefetch.
WIDEN_AFTER = 32


class LimitedQueues:
    """The limited queues a worker process consumes one event per run at once, and when each last waited."""

    def __init__(self, consumer: Any, runs_at_once: int) -> None:
        self.consumer, self.runs_at_once = consumer, runs_at_once
        #: The queues consumed narrowly now, each with the events that arrived since one last waited.
        self.narrow: dict[str, int] = {}

    def start(self) -> None:
        """A new connection: its limited queues are consumed narrowly first (before the event loop consumes the
        others at the worker's prefetch)."""
        self.narrow.clear()
        task_consumer = self.consumer.task_consumer
        for queue in [queue.name for queue in task_consumer.queues] if task_consumer is not None else ():
            if keyed_limit(self.consumer.app.context, queue) is False:
                self._consume_again(queue, limited_prefetch(False, self.runs_at_once), starting=True)
                self.narrow[queue] = 0

    def held(self, queue: str) -> None:
        """An event of ``queue`` waits for its limit: its queue gives this process no more than it runs at once."""
        if queue in self.narrow:
            self.narrow[queue] = 0
        elif keyed_limit(self.consumer.app.context, queue) is False and self._consume_again(
            queue, limited_prefetch(False, self.runs_at_once)
        ):  # not a key's queue, nor a shared one
            self.narrow[queue] = 0
            logger.debug("queue %s is at its limit: consumed %d event(s) at a time", queue, self.runs_at_once)

    def seen(self, queue: str) -> None:
        """An event of ``queue`` arrived: after enough in a row that did not wait, the worker's prefetch again."""
        arrived = self.narrow.get(queue)
        if arrived is None:
            return
        if arrived + 1 < WIDEN_AFTER:
            self.narrow[queue] = arrived + 1
            return
        del self.narrow[queue]
        self._consume_again(queue, None)
        logger.debug("queue %s is under its limit: consumed at the worker's prefetch", queue)

    def _consume_again(self, queue: str, prefetch: int | None, starting: bool = False) -> bool:
        """Start consuming ``queue`` (again, when not ``starting``) with ``prefetch`` (``None``: the worker's); not
        a queue the worker stopped consuming (a breaker, remote control)."""
        consumer = self.consumer
        task_consumer = consumer.task_consumer
        if task_consumer is None or not (starting or task_consumer.consuming_from(queue)):
            return False
        # Celery's prefetch per consumer (quorum queues); with a prefetch per channel, none per consumer besides.
        usual = 0 if getattr(consumer, "qos_global", False) else int(getattr(consumer.qos, "value", 0) or 0)
        channel = task_consumer.channel
        if task_consumer.consuming_from(queue):
            task_consumer.cancel_by_queue(queue)
        others = [other for other in task_consumer.queues if other.name != queue]
        channel.basic_qos(0, usual if prefetch is None else prefetch, False)
        try:
            task_consumer.queues = []  # upstream: consume() starts each queue of the consumer's list not consumed
            task_consumer.add_queue(consumer.app.amqp.queues[queue])
            task_consumer.consume()
        finally:
            task_consumer.queues = [*others, *task_consumer.queues]
            channel.basic_qos(0, usual, False)
        return True
