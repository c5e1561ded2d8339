"""The ``awaits`` test service: its handlers are coroutines (``async def``), run by a plain worker."""

import asyncio
import json
import os
import socket
import threading

from amqp_events import Middleware, current_event, optional, poisonous, retry
from amqp_events.celery import events_app
from services.behaviour import behave, record

app = events_app(
    "awaits",
    broker_url=os.environ["BROKER_URL"],
    amqp_events_max_retries=int(os.environ.get("MAX_RETRIES", "3")),
    amqp_events_async_shutdown_timeout=float(os.environ.get("SHUTDOWN_TIMEOUT", "30")),
)
#: Coroutines of test.together in flight in this process, by group.
_in_flight: dict[str, int] = {}


class LoopOfHooks(Middleware):
    """An async hook: it records the loop it ran on (the handlers' own, in a worker)."""

    async def before_handle(self, attempt):
        if attempt.delivery.headers.get("task") == "test.together":
            await asyncio.sleep(0)
            line = {"tag": "hook", "hook": True, "loop": id(asyncio.get_running_loop())}
            with open(os.environ["RECORD_FILE"], "a") as out:  # current_event() is the handler's alone
                out.write(json.dumps(line) + "\n")


app.add_middleware(LoopOfHooks())


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


@app.handler("test.together", max_retries=0)
async def on_together(tag, group, size):
    """Waits (30 s at most) until ``size`` handlers of ``group`` are in flight at once in this process."""
    _in_flight[group] = _in_flight.get(group, 0) + 1
    try:
        await asyncio.wait_for(_all_there(group, size), 30)
        record("awaits", tag=tag, together=True, loop=id(asyncio.get_running_loop()))
    except asyncio.TimeoutError:
        record("awaits", tag=tag, together=False, most=_in_flight[group])


async def _all_there(group, size):
    while _in_flight[group] < size:
        await asyncio.sleep(0.005)


@app.handler("test.lingering", max_retries=0)
async def on_lingering(tag, seconds, until=None):
    """Sleeps ``seconds``, or with ``until`` (a file's path) on a timer until the test makes that file."""
    record("awaits", tag=tag, state="started")
    if until is None:
        await asyncio.sleep(seconds)
    while until is not None and not os.path.exists(until):
        await asyncio.sleep(0.05)
    record("awaits", tag=tag, state="finished")


@app.handler("test.reply", max_retries=0)
async def on_reply(tag, seconds, until=None):
    """Waits on a socket alone (no timer of its loop): another thread writes to it after ``seconds``, or with
    ``until`` (a file's path) once the test makes that file."""
    record("awaits", tag=tag, state="started")
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    cancelled = threading.Event()
    writer = threading.Thread(target=_write_once, args=(theirs, seconds, until, cancelled), daemon=True)
    writer.start()
    try:
        await asyncio.get_running_loop().sock_recv(ours, 1)
    finally:
        cancelled.set()
        writer.join()
        ours.close()
        theirs.close()
    record("awaits", tag=tag, state="finished", thread=threading.current_thread().name)


def _write_once(sock, seconds, until, cancelled):
    if until is None:
        cancelled.wait(seconds)
    while until is not None and not os.path.exists(until) and not cancelled.wait(0.05):
        pass
    if not cancelled.is_set():
        sock.send(b"x")
