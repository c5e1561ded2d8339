"""FastStream on the same quorum queue, with the same prefetch and a no-op subscriber: a baseline.

``faststream run faststream_app:app --workers 2`` (two processes, asyncio in each). Messages are acked once
the subscriber returned (FastStream's default acknowledgement policy), as a late ack.
"""

import asyncio
import os

from faststream import FastStream
from faststream.rabbit import RabbitBroker, RabbitQueue
from faststream.rabbit.schemas import Channel, QueueType
from marks import mark

broker = RabbitBroker(os.environ["BROKER_URL"], default_channel=Channel(prefetch_count=int(os.environ["PREFETCH"])))
app = FastStream(broker)
queue = RabbitQueue(os.environ["QUEUE"], durable=True, queue_type=QueueType.QUORUM, declare=False)


#: Seconds the subscriber waits as on a network call (bench/coroutines.py).
IO_WAIT = float(os.environ.get("IO_WAIT") or 0)


@broker.subscriber(queue)
async def noop(body: list) -> None:
    if IO_WAIT:
        await asyncio.sleep(IO_WAIT)
    mark(body[1]["n"], body[1]["last"])
