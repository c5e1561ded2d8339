"""The celery-amqp-events service the benchmarks run: a no-op handler and a handler that retries once."""

import asyncio
import os

import tracing_mode  # noqa: F401  # TRACING=absent|idle|on, before the library
from marks import mark

from amqp_events.celery import events_app

app = events_app(
    os.environ.get("SERVICE", "bench"),
    broker_url=os.environ["BROKER_URL"],
    amqp_events_async_concurrency=int(os.environ.get("ASYNC_CONCURRENCY") or 100),
    amqp_events_async_shutdown_timeout=1.0,
)
#: Seconds the coroutine handler waits as on a network call (bench/coroutines.py); HOLD: marks, then waits that long.
IO_WAIT = float(os.environ.get("IO_WAIT") or 0)
HOLD = float(os.environ.get("HOLD") or 0)


if os.environ.get("ASYNC_NOOP"):  # the same handler as a coroutine (bench/coroutines.py)

    @app.handler("bench.noop")
    async def noop(n, last=False):
        if HOLD:
            mark(n, last)
            await asyncio.sleep(HOLD)
            return
        if IO_WAIT:
            await asyncio.sleep(IO_WAIT)
        mark(n, last)

else:

    @app.handler("bench.noop")
    def noop(n, last=False):
        mark(n, last)


@app.handler("bench.wait", bind=True)
def wait(self, n, delay):
    mark(n, False, attempt=self.request.retries + 1)
    if self.request.retries == 0:
        raise self.retry(countdown=delay)
