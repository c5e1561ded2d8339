"""FastStream as its users run it: its own publisher and message format (a JSON object of the arguments), a
subscriber that takes them as parameters, and its default queue (``RabbitQueue(name)``); a baseline.

``faststream run faststream_own:app --workers N``. ``bench/handling.py`` fills the queue with
``broker.publish({...}, queue=...)``. The prefetch is the other contenders' (``PREFETCH``).
"""

import asyncio
import os

from faststream import FastStream
from faststream.rabbit import RabbitBroker, RabbitQueue
from faststream.rabbit.schemas import Channel
from marks import mark

broker = RabbitBroker(os.environ["BROKER_URL"], default_channel=Channel(prefetch_count=int(os.environ["PREFETCH"])))
app = FastStream(broker)

#: Seconds the subscriber waits as on a network call (bench/coroutines.py).
IO_WAIT = float(os.environ.get("IO_WAIT") or 0)


@broker.subscriber(RabbitQueue(os.environ["QUEUE"]))
async def noop(n: int, last: bool = False) -> None:
    if IO_WAIT:
        await asyncio.sleep(IO_WAIT)
    mark(n, last)
