"""How many messages one worker process holds unacked: the prefetch of each of its consumers.

Quorum queues count the prefetch (QoS) per consumer, and Celery gives every queue a worker consumes the same
count (``worker_prefetch_multiplier`` x the pool's processes): a worker of a service with 50 handlers would hold
50 times that. ``amqp_events_worker_prefetch_limit`` bounds the whole: each consumer gets its share, at least one
message per pool process. A worker running coroutine handlers keeps at least ``amqp_events_async_concurrency``
in hand (AMQP's count is 16 bits), so that they have work.

Checked on Celery 5.5.3 and 5.7.0 (tests/broker/test_prefetch.py): Celery restores
``prefetch_multiplier x processes`` after a reconnection, so both are set.
"""

from __future__ import annotations

from typing import Any

#: AMQP's prefetch count is a 16-bit number.
MAX_PREFETCH = 65_535


def size_prefetch(consumer: Any, limit: int, queues: int, in_flight: int = 0) -> None:
    """Set ``consumer``'s prefetch so that its ``queues`` consumers hold about ``limit`` messages in all (at
    least one per pool process each), and at least ``in_flight`` (coroutines) when there are any."""
    if not consumer.initial_prefetch_count:  # prefetch disabled (worker_prefetch_multiplier = 0)
        return
    # Upstream (5.5): the prefork pool's num_processes fails until the pool started; its limit is the -c given.
    processes = max(1, consumer.pool.limit or 1)
    per_consumer = max(consumer.initial_prefetch_count, in_flight)
    per_consumer = min(per_consumer, max(1, max(limit, in_flight) // max(1, queues)), MAX_PREFETCH)
    consumer.prefetch_multiplier = max(1, per_consumer // processes)
    consumer.initial_prefetch_count = consumer.prefetch_multiplier * processes
