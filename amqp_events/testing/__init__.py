"""Helpers for testing services built with celery-amqp-events.

* :func:`in_process` (:mod:`amqp_events.testing.in_process`): services'
  handlers run in the test's own thread, on a broker in memory and a
  virtual clock, deciding outcomes with the worker's own code.
* :mod:`amqp_events.testing.fixtures`: pytest fixtures (the in-process mode,
  and services as real workers against a real RabbitMQ node:
  ``pytest_plugins = ["amqp_events.testing.fixtures"]``), on the private servers
  of :mod:`amqp_events.local` (RabbitMQ, PostgreSQL, Redis).
* :mod:`amqp_events.testing.workers`: ``celery worker`` processes, stopped by PID.
* :func:`wait_for`: poll a condition with a deadline; :func:`json_lines`: read what processes append.

Nothing in the library's runtime (producers, workers) imports this package.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def json_lines(path: Path) -> list[Any]:
    """The complete JSON lines of a file other processes append to (a line being written is left for later)."""
    text = path.read_text() if path.exists() else ""
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def wait_for(condition: Callable[[], T], timeout: float = 30.0, interval: float = 0.1, what: str = "") -> T:
    """Poll ``condition`` until it returns something truthy; fail (``AssertionError``) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or condition}")
        time.sleep(interval)


from amqp_events.testing.in_process import InProcess, NotModelled, UnhandledEvent, in_process  # noqa: E402

__all__ = ["InProcess", "NotModelled", "UnhandledEvent", "in_process", "json_lines", "wait_for"]
