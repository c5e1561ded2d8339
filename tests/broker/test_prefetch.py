"""The prefetch of a worker is bounded as a whole, not per queue: a service with many handlers has its worker
hold ``amqp_events_worker_prefetch_limit`` messages in all (at least one per queue), not 16 per queue."""

from __future__ import annotations

import pytest

from amqp_events.testing import wait_for

PER_QUEUE = 20
EVENTS = [f"many.e{n}" for n in range(40)]  # services/many.py's


@pytest.mark.parametrize(("limit", "held_per_queue"), [("80", 2), ("10", 1)])
def test_a_worker_of_forty_handlers_holds_its_limit_not_sixteen_per_queue(
    limit, held_per_queue, worker, producer, records, tmp_path
):
    hold = tmp_path / "hold"
    hold.touch()  # the first message a handler takes waits: nothing is acked meanwhile
    worker("many", env={"PREFETCH_LIMIT": limit, "HOLD_FILE": str(hold)})
    with producer.batch():
        for event in EVENTS:
            for n in range(PER_QUEUE):
                producer.fire(event, [n], {})
    queues = [f"many:{event}" for event in EVENTS]
    with producer.connection_for_read() as connection:  # one connection for every look (40 queues each)
        channel = connection.default_channel

        def taken() -> list[int]:
            return [PER_QUEUE - channel.queue_declare(queue, passive=True).message_count for queue in queues]

        # The broker hands each consumer its share at once; with Celery's 16 per consumer each queue would lose 16.
        wait_for(lambda: set(taken()) == {held_per_queue}, 60, interval=0.3, what=f"{held_per_queue} from each queue")
        assert sum(taken()) == held_per_queue * len(queues) <= max(int(limit), len(queues))
    hold.unlink()
    records.wait(PER_QUEUE * len(queues), timeout=120)
