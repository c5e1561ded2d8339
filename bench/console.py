"""The console's pages with a full archive: each page's load time beside reading the same archive in the library.

A service's archive is filled to ``size.archived`` messages (10,000: the
default archive's bound), each with a traceback of a few kB, as a handler's
failures leave them. The console (``amqp-events console``, in a process of
its own) serves the overview (which counts every archive by reason), a page
of the archive (500 rows), and the API's listing of every message; beside
them, the same archive listed by :meth:`Archive.list` in this process, the
reading every page is built on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid

from amqp_events import events_app
from amqp_events.local.processes import free_port
from amqp_events.wire.message import OutgoingMessage
from bench.harness import Bench, median
from bench.scenarios import Result, Size

TRACEBACK = (
    "Traceback (most recent call last):\n"
    + '  File "shop/handlers.py", line 42, in charge\n    gateway.charge(order)\n' * 30
)


def pages_with_a_full_archive(bench: Bench, size: Size) -> Result:
    with bench.run("console") as run:
        app = events_app("shop", broker_url=run.url)

        @app.handler("shop.order.placed")
        def charge(order_id: int) -> None:
            """Never runs: the archive is filled directly."""

        app.declare_topology()
        _fill_archive(app, size.archived)
        port = free_port()
        command = [sys.executable, "-m", "amqp_events.cli", "--broker", run.url, "--management-url",
                   bench.node.management.base_url, "console", "--bind", f"127.0.0.1:{port}"]  # fmt: skip
        console = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_serving(base, console)
            repeats = max(size.repeats, 2)
            overview = median([_timed(base + "/") for _ in range(repeats)])
            page = median([_timed(base + "/services/shop/archive") for _ in range(repeats)])
            listed = median([_timed(base + "/api/services/shop/archive") for _ in range(repeats)])
            reading = median([_time(lambda: app.archive().list()) for _ in range(repeats)])
        finally:
            console.terminate()
            console.wait(10)
            app.close()
    return Result(
        f"the console with {size.archived:,} archived messages: the overview page",
        f"{overview:.2f} s (a page of 500: {page:.2f} s; the API listing all: {listed:.2f} s)",
        f"reading the archive in the library: {reading:.2f} s ({overview / reading:.2f}x)",
        overview / reading,
        "reported",
        None,
        {"overview": overview, "archive page": page, "API listing": listed, "Archive.list()": reading},
    )


def _fill_archive(app: object, count: int) -> None:
    publisher = app.context.transport.batch(1000)  # type: ignore[attr-defined]
    for n in range(count):
        event_id = str(uuid.uuid4())
        headers = {
            "task": "shop.order.placed", "id": event_id, "retries": 3, "archive_reason": "max_retries",
            "archive_service": "shop", "archive_handler": "shop.handlers.charge",
            "archive_queue": "shop:shop.order.placed",
            "archive_exception_type": "ConnectionError", "archive_exception_message": f"gateway down ({n})",
            "archive_traceback": TRACEBACK, "archive_attempts": 4, "archived_at": "2026-11-25T10:00:00+00:00",
        }  # fmt: skip
        body = json.dumps([[n], {}, None]).encode()
        publisher.publish(OutgoingMessage("", "shop.archive", headers, body, event_id, "application/json", "utf-8"))
    publisher.wait()
    publisher.close()


def _wait_serving(base: str, console: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if console.poll() is not None:
            raise RuntimeError("the console exited")
        try:
            urllib.request.urlopen(base + "/api/services", timeout=2).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("the console did not start")


def _timed(url: str) -> float:
    return _time(lambda: urllib.request.urlopen(url, timeout=120).read())


def _time(action: object) -> float:
    started = time.monotonic()
    action()  # type: ignore[operator]
    return time.monotonic() - started
