"""What a test handler does, as told by its payload; every run is recorded as a JSON line."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import time
from typing import Any

from celery.exceptions import Reject

from amqp_events import PermanentFailure, current_event, optional, poisonous, retry
from amqp_events.clock import utcnow


class Flaky(RuntimeError):
    """A transient failure the test asked for."""


def maybe_coroutine(function: Any) -> Any:
    """With ``COROUTINES=1``, the handler as a coroutine doing the same (the contract with coroutine handlers)."""
    if os.environ.get("COROUTINES") != "1":
        return function

    @functools.wraps(function)
    async def run(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.001)  # gives the loop back: other coroutines run meanwhile
        return function(*args, **kwargs)

    return run


def record(service: str, **fields: Any) -> None:
    """Append one line to ``$RECORD_FILE`` (one write with O_APPEND, so lines never interleave)."""
    event = current_event()
    line = {
        "service": service,
        "event": event.name,
        "id": event.id,
        "attempt": event.attempt,
        "fired_at": event.fired_at.isoformat() if event.fired_at else None,
        "fired_by": event.fired_by,
        "key": event.key,
        "pid": os.getpid(),
        "time": utcnow().timestamp(),  # the library's clock: virtual in the in-process mode
        **fields,
    }
    with open(os.environ["RECORD_FILE"], "a") as out:
        out.write(json.dumps(line) + "\n")


def behave(task: Any, service: str, tag: str, how: dict[str, Any] | None) -> None:
    """Record this run, then fail, retry, crash or sleep as ``how`` says."""
    how = {} if os.environ.get("FIXED") else how or {}  # FIXED=1: "the fix is deployed"
    attempt = current_event().attempt
    record(service, tag=tag)
    if how.get("only", service) != service:
        return
    if how.get("sleep"):
        time.sleep(how["sleep"])
    if how.get("until"):  # runs until the test creates this file (at most 60 s): a run that lasts as long as needed
        deadline = time.monotonic() + 60
        while not os.path.exists(how["until"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    if how.get("allocate_mb"):  # resident for a moment: the process's peak memory rises by as much
        held = b"x" * (how["allocate_mb"] << 20)
        del held
    if how.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    if how.get("exit"):
        raise SystemExit(3)
    if how.get("reject"):
        raise Reject("rejected by the test", requeue=False)
    if how.get("permanent"):
        raise PermanentFailure(f"{tag} can never succeed")
    if how.get("retry_with"):
        raise task.retry(**how["retry_with"])
    if "countdown" in how and attempt <= how.get("countdown_times", 1):
        raise task.retry(countdown=how["countdown"], max_retries=how.get("retry_max_retries"))
    if attempt <= how.get("fail_times", 0) or how.get("always_fail"):
        raise Flaky(f"{tag} failed on attempt {attempt}")


def in_sections(service: str, tag: str, fail: dict[str, Any]) -> None:
    """A handler with an optional, a retry and a poisonous section; ``fail`` says which fail, and when.

    ``notify``: the optional section fails every time; ``capture``: the retry section (3 retries, its own
    backoff) fails on the first N attempts; ``parse``: the poisonous section fails; ``plain``: the attempts
    on which the handler fails outside any section (the handler's own policy).
    """
    fail = {} if os.environ.get("FIXED") else fail
    event = current_event()
    record(service, tag=tag, failed_section=event.failed_section)
    with optional(ConnectionError, name="notify"):
        if fail.get("notify"):
            raise ConnectionError("the notification service is down")
    with retry(max_retries=3, backoff_base=1, on=(ConnectionError,), name="capture"):
        if event.attempt <= fail.get("capture", 0):
            raise ConnectionError(f"payments down on attempt {event.attempt}")
    with poisonous(name="parse"):
        if fail.get("parse"):
            raise KeyError("amount")
    if event.attempt in fail.get("plain", ()):
        raise Flaky(f"{tag} failed on attempt {event.attempt}")
