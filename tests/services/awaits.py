"""The ``awaits`` test service: its handlers are coroutines (``async def``), run by a plain worker."""

import asyncio
import os

from amqp_events import current_event, optional, poisonous, retry
from amqp_events.celery import events_app
from services.behaviour import behave, record

app = events_app(
    "awaits",
    broker_url=os.environ["BROKER_URL"],
    amqp_events_max_retries=int(os.environ.get("MAX_RETRIES", "3")),
)


@app.handler("test.ping", bind=True)
async def on_ping(self, tag, how=None):
    await asyncio.sleep(0.001)  # a coroutine that gives its loop back before it goes on
    behave(self, "awaits", tag, how)


@app.handler("test.slow", soft_time_limit=1, max_retries=1)
async def on_slow(tag, seconds):
    record("awaits", tag=tag)
    if current_event().attempt == 1:
        await asyncio.sleep(seconds)  # cancelled by the soft time limit: a failure, retried


@app.handler("test.sections", max_retries=1)
async def on_sections(tag, fail):
    event = current_event()
    record("awaits", tag=tag, failed_section=event.failed_section)
    async with optional(ConnectionError, name="notify"):
        if fail.get("notify"):
            raise ConnectionError("the notification service is down")
    async with retry(max_retries=3, backoff_base=1, on=(ConnectionError,), name="capture"):
        if event.attempt <= fail.get("capture", 0):
            raise ConnectionError(f"payments down on attempt {event.attempt}")
    async with poisonous(name="parse"):
        if fail.get("parse"):
            raise KeyError("amount")
