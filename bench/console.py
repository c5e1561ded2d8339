"""The console's pages with full archives: each page's time now beside the console of a revision before the
index (:data:`BASELINE`), both serving the same vhost in the same run.

``size.console_services`` services (10) each hold ``size.archived`` archived
messages (10,000: the default archive's bound), each with a traceback of a few
kB, in two causes, as a handler's failures leave them. Each console
(``amqp-events console``, in a process of its own) serves the overview, a
service's page, the failure groups (now) and a page of the archive; the time
the console takes to read every archive once (its index) is reported too.
The baseline is the console of :data:`BASELINE`, run from a ``git worktree``
of it, which read the archives on every page.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from amqp_events import events_app
from amqp_events.archive import Selection
from amqp_events.local.processes import free_port, terminate
from amqp_events.wire.message import OutgoingMessage
from bench.harness import Bench, median
from bench.scenarios import Result, Size

#: The last revision whose console read the archives for every page (the index came after it).
BASELINE = "7230ac1"
ROOT = Path(__file__).resolve().parent.parent
TRACEBACK = (
    "Traceback (most recent call last):\n"
    + '  File "shop/handlers.py", line 42, in charge\n    gateway.charge(order)\n' * 30
)


def pages_with_a_full_archive(bench: Bench, size: Size) -> Result:
    with bench.run("console") as run:
        services = [f"shop{n:02d}" for n in range(size.console_services)]
        for service in services:
            app = events_app(service, broker_url=run.url)

            @app.handler("shop.order.placed")
            def charge(order_id: int) -> None:
                """Never runs: the archive is filled directly."""

            app.declare_topology()
            _fill_archive(app, size.archived)
            app.close()
        management = bench.node.management.base_url
        repeats = max(size.repeats, 2)
        with _console(run.url, management, ROOT) as (base, pid):
            started = time.monotonic()
            _wait_serving(base + "/")  # the first page waits for the first reading: every archive indexed
            indexed = time.monotonic() - started
            group = _json(f"{base}/api/services/{services[0]}/groups")
            counts = [one["count"] for one in group["groups"]]
            assert counts == [size.archived * 9 // 10, size.archived // 10], (counts, group["archived"])
            assert all(f'data-service="{service}"' in _page(base + "/") for service in services)
            pages = {
                "overview": base + "/",
                "a service": f"{base}/services/{services[0]}/archive",
                "a failure group": f"{base}/services/{services[0]}/groups/{group['groups'][0]['id']}",
                "the groups (API)": f"{base}/api/services/{services[0]}/groups",
            }
            now = {name: median([_timed(url) for _ in range(repeats)]) for name, url in pages.items()}
            resident = _resident_mb(pid)
            caught_up = _one_more_failure(run.url, services[0], base)
            caught_up_below = _one_more_below_the_bound(run.url, services[1], base, size.archived)
        with _baseline_tree() as tree, _console(run.url, management, tree) as (base, _):
            _wait_serving(base + "/api/services")
            before = {
                "overview": median([_timed(base + "/") for _ in range(repeats)]),  # reads every archive
                "a service": median([_timed(f"{base}/services/{services[0]}/archive") for _ in range(repeats)]),
            }
    ratio = before["overview"] / now["overview"]
    return Result(
        f"the console, {size.console_services} services x {size.archived:,} archived: the overview page",
        f"{now['overview'] * 1000:.0f} ms (a service: {now['a service'] * 1000:.0f} ms; a failure group: "
        f"{now['a failure group'] * 1000:.0f} ms; the groups API: {now['the groups (API)'] * 1000:.0f} ms; "
        f"every archive indexed in {indexed:.1f} s, in the background; one more failure shown within "
        f"{caught_up_below:.1f} s, {caught_up:.1f} s in a full archive; the console's memory {resident:.0f} MB)",
        f"the console of {BASELINE}: {before['overview']:.2f} s (a service: {before['a service']:.2f} s)",
        ratio,
        "every page < 300 ms",
        max(now.values()) < 0.3,
        {
            "memory (MB)": resident,
            **{f"now: {name}": value for name, value in now.items()},
            **{f"{BASELINE}: {name}": value for name, value in before.items()},
        },
    )


@contextlib.contextmanager
def _console(broker_url: str, management: str, tree: Path) -> Iterator[tuple[str, int]]:
    """``amqp-events console`` of the package in ``tree``, on a free port; its base URL and process id."""
    port = free_port()
    command = [sys.executable, "-m", "amqp_events.cli", "--broker", broker_url, "--management-url", management,
               "console", "--bind", f"127.0.0.1:{port}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    console = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}", console.pid
    finally:
        terminate(console.pid, 10)


@contextlib.contextmanager
def _baseline_tree() -> Iterator[Path]:
    """A checkout of :data:`BASELINE` beside this one (``git worktree``), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="bench-console-") as parent:
        tree = Path(parent) / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), BASELINE],
                       check=True, capture_output=True)  # fmt: skip
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


def _fill_archive(app: object, count: int) -> list[str]:
    """``count`` archived messages of two causes (nine in ten a gateway down, one a missing customer); their ids."""
    service = app.service  # type: ignore[attr-defined]
    publisher = app.context.transport.batch(1000)  # type: ignore[attr-defined]
    ids = []
    for n in range(count):
        exception, message = ("ConnectionError", f"gateway down ({n})") if n % 10 else ("KeyError", f"'c{n}'")
        event_id = str(uuid.uuid4())
        ids.append(event_id)
        headers = {
            "task": "shop.order.placed", "id": event_id, "retries": 3, "archive_reason": "max_retries",
            "archive_service": service, "archive_handler": "shop.handlers.charge",
            "archive_queue": f"{service}:shop.order.placed",
            "archive_exception_type": exception, "archive_exception_message": message,
            "archive_traceback": TRACEBACK, "archive_attempts": 4,
            "archived_at": f"2026-11-25T10:{n // 6000 % 60:02d}:{n // 100 % 60:02d}.{n % 100:02d}0000+00:00",
        }  # fmt: skip
        body = json.dumps([[n], {}, None]).encode()
        archive = f"{service}.archive"
        publisher.publish(OutgoingMessage("", archive, headers, body, event_id, "application/json", "utf-8"))
    publisher.wait()
    publisher.close()
    return ids


def _wait_serving(url: str) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=600).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"the console did not answer {url}")


def _one_more_failure(broker_url: str, service: str, base: str) -> float:
    """Seconds from one more message archived in ``service`` (its archive full: the oldest dropped) until the
    console lists it in its group."""
    app = events_app(service, broker_url=broker_url)
    started = time.monotonic()
    [event_id] = _fill_archive(app, 1)
    app.close()
    groups = f"{base}/api/services/{service}/groups"
    while all(event_id not in _page(f"{groups}/{group['id']}") for group in _json(groups)["groups"]):
        if time.monotonic() - started > 120:
            raise TimeoutError("the console did not see the new failure")
        time.sleep(0.05)
    return time.monotonic() - started


def _one_more_below_the_bound(broker_url: str, service: str, base: str, archived: int) -> float:
    """Seconds from one more message archived in ``service`` (below its bound: its size grows) until the console
    counts it."""
    app = events_app(service, broker_url=broker_url)
    app.archive().purge(Selection.of(limit=1))
    groups = f"{base}/api/services/{service}/groups"
    deadline = time.monotonic() + 120
    while _json(groups)["archived"] != archived - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    _fill_archive(app, 1)
    app.close()
    while _json(groups)["archived"] != archived:
        if time.monotonic() - started > 120:
            raise TimeoutError("the console did not count the new failure")
        time.sleep(0.05)
    return time.monotonic() - started


def _resident_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def _json(url: str) -> dict:  # type: ignore[type-arg]
    return json.loads(_page(url))  # type: ignore[no-any-return]


def _page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=120) as response:
        return response.read().decode()  # type: ignore[no-any-return]


def _timed(url: str) -> float:
    return _time(lambda: urllib.request.urlopen(url, timeout=120).read())


def _time(action: object) -> float:
    started = time.monotonic()
    action()  # type: ignore[operator]
    return time.monotonic() - started
