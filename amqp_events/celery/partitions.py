"""The partitions of ordered handlers, each consumed on a channel of its own and shared out among workers.

Every worker of a service consumes every partition; RabbitMQ gives each
partition's messages to one of them at a time (single active consumer). A
worker that takes more partitions than its share (the partitions divided by
the workers consuming them, rounded up) hands the extra ones over, one at a
time: it starts no more of the partition's messages, lets those running
finish, then closes the partition's channel. RabbitMQ gives what the channel
held back first, in order, to the next worker, and this worker consumes the
partition again, behind the others. A channel of its own per partition is
what makes this safe: cancelling a consumer instead would let the next worker
start while this one still holds earlier messages.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/broker/test_ordered.py).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from celery import bootsteps
from kombu import Consumer
from kombu.message import Message

from amqp_events.dispatch.settling import ChannelSettler
from amqp_events.topology.names import is_partition_queue, workers_queue_name

logger = logging.getLogger(__name__)

#: How often a worker looks at its share of the partitions, and at a hand-over in progress (seconds).
TICK = 1.0
#: Seconds between two looks at the share; a hand-over also waits this long after the previous one.
BALANCE_EVERY = 5.0
#: A partition whose last message came longer ago than this is not counted as taken (seconds).
ACTIVE_WINDOW = 30.0
#: Seconds before a worker consumes a partition it handed over again (as a stand-by).
CONSUME_AGAIN_AFTER = 2.0
#: Longest wait for a partition's running messages to finish before its channel closes anyway (seconds).
HAND_OVER_TIMEOUT = 60.0


class Partitions(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer step: consume each partition of the service on a channel of its own; share them out."""

    label = "amqp-events partitions"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        #: Partition name -> its channel and queue.
        self.channels: dict[str, tuple[Any, Any]] = {}
        self.last_message: dict[str, float] = {}
        #: Partitions being handed over, and when their channels close at the latest.
        self.handing_over: dict[str, float] = {}
        self.next_look = 0.0
        self.timer_entry: Any = None
        #: The channel on which this worker is counted (:func:`~amqp_events.topology.names.workers_queue_name`).
        self.roll_call: Any = None

    def include_if(self, c: Any) -> bool:
        return not c.host.consumes_in_processes  # each of the pool's processes consumes partitions

    def start(self, c: Any) -> None:
        queues = [q for q in c.app.topology.event_queues if is_partition_queue(q.name, c.app.service)]
        if not queues:
            return
        self.handing_over, self.next_look = {}, time.monotonic() + BALANCE_EVERY
        self.roll_call = c.connection.channel()
        workers = c.app.topology.queue(workers_queue_name(c.app.service))
        Consumer(self.roll_call, queues=[workers], no_ack=True, on_message=ignore, auto_declare=False).consume()
        for queue in queues:
            self.consume(c, queue)
        if self.timer_entry is None:
            self.timer_entry = c.timer.call_repeatedly(TICK, self.tick, (c,))

    def stop(self, c: Any) -> None:
        """Stop consuming: let what runs finish (for at most the hand-over timeout), then close the channels,
        so that what this worker held goes back to the broker first, in order."""
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None
        runner = c.ordered_runner
        if runner is not None:
            for partition in self.channels:
                runner.pause(partition)
            deadline = time.monotonic() + HAND_OVER_TIMEOUT
            while not all(runner.idle(partition) for partition in self.channels) and time.monotonic() < deadline:
                time.sleep(0.05)
        for partition in list(self.channels):
            self.stop_consuming(c, partition)
        if self.roll_call is not None:
            close_quietly(self.roll_call)
            self.roll_call = None

    shutdown = stop

    # -- consuming -----------------------------------------------------------------------------------

    def consume(self, c: Any, queue: Any) -> None:
        channel = c.connection.channel()
        channel.basic_qos(0, c.initial_prefetch_count or 1, False)
        consumer = Consumer(
            channel,
            queues=[queue],
            accept=c.app.conf.accept_content,
            on_message=lambda message: self.received(c, queue.name, message),
            on_decode_error=lambda message, _: self.received(c, queue.name, message),  # admitted as it is
            auto_declare=False,
        )
        consumer.consume()
        self.channels[queue.name] = (channel, queue)

    def received(self, c: Any, partition: str, message: Message) -> None:
        self.last_message[partition] = time.monotonic()
        c.dispatcher.dispatch(message, partition, ChannelSettler(message, c.call_soon))

    def stop_consuming(self, c: Any, partition: str) -> None:
        channel, _ = self.channels.pop(partition)
        close_quietly(channel)
        if c.ordered_runner is not None:
            c.ordered_runner.forget(partition)

    # -- sharing out ---------------------------------------------------------------------------------

    def tick(self, c: Any) -> None:
        try:
            if self.handing_over:
                self.finish_hand_overs(c)
            elif time.monotonic() >= self.next_look:
                self.next_look = time.monotonic() + BALANCE_EVERY
                self.rebalance(c)
        except c.connection_errors:  # the consumer reconnects and starts this step again
            logger.debug("sharing out partitions", exc_info=True)

    def rebalance(self, c: Any) -> None:
        if not self.channels or c.ordered_runner is None:
            return
        workers = self.roll_call.queue_declare(workers_queue_name(c.app.service), passive=True).consumer_count
        share = math.ceil(len(self.channels) / max(workers, 1))
        now = time.monotonic()
        taken = [p for p in self.channels if now - self.last_message.get(p, -math.inf) < ACTIVE_WINDOW]
        extra = sorted(taken)[share:]
        if extra:
            logger.info("handing %s over: %d partitions taken, a share of %d", ", ".join(extra), len(taken), share)
        for partition in extra:
            c.ordered_runner.pause(partition)
            self.handing_over[partition] = now + HAND_OVER_TIMEOUT

    def finish_hand_overs(self, c: Any) -> None:
        for partition, deadline in list(self.handing_over.items()):
            if c.ordered_runner.idle(partition) or time.monotonic() >= deadline:
                queue = self.channels[partition][1]
                self.stop_consuming(c, partition)
                self.last_message.pop(partition, None)
                del self.handing_over[partition]
                c.timer.call_after(CONSUME_AGAIN_AFTER, self.consume_again, (c, queue))
        if not self.handing_over:
            self.next_look = time.monotonic() + BALANCE_EVERY

    def consume_again(self, c: Any, queue: Any) -> None:
        if queue.name not in self.channels and self.timer_entry is not None:
            try:
                self.consume(c, queue)
            except c.connection_errors:  # the consumer reconnects and starts this step again
                logger.debug("consuming %s again", queue.name, exc_info=True)


def close_quietly(channel: Any) -> None:
    try:
        channel.close()
    except Exception:  # the connection is gone already: so is what the channel held
        logger.debug("closing a channel", exc_info=True)


def ignore(message: Message) -> None:
    """Nothing is sent to the queue that counts workers; should something be, it is dropped (unacked: no_ack)."""
