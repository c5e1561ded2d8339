"""What the tests share besides fixtures: the suite's paths, the records test handlers write, waiting for an
archive, the installed command, reading metrics, the test services' apps and tables."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from amqp_events import EventsApp
from amqp_events.testing import json_lines, wait_for

TESTS = Path(__file__).parent
#: The checkout.
ROOT = TESTS.parent
#: The installed ``amqp-events`` entry point of this environment.
AMQP_EVENTS = str(Path(sys.executable).parent / "amqp-events")


BARRIER = "barrier-"


class Records:
    """The JSON lines test handlers append to ``$RECORD_FILE``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def all(self, barriers: bool = False, **match: Any) -> list[dict[str, Any]]:
        """Records matching ``match`` (the sentinels of :meth:`barrier` only with ``barriers=True``)."""
        lines = json_lines(self.path)
        return [
            line
            for line in lines
            if all(line.get(key) == value for key, value in match.items())
            and (barriers or not str(line.get("tag", "")).startswith(BARRIER))
        ]

    def wait(self, count: int, timeout: float = 30.0, **match: Any) -> list[dict[str, Any]]:
        """Wait until at least ``count`` records match; returns them."""
        return wait_for(
            lambda: (found := self.all(**match)) and len(found) >= count and found,
            timeout,
            what=f"{count} records matching {match} (have {len(self.all(**match))})",
        )

    def barrier(self, producer: EventsApp, services: tuple[str, ...], workers: int = 1, timeout: float = 30.0) -> None:
        """Return once every message queued so far for ``services`` has been handled.

        Fires ``test.ping`` sentinels (handled in queue order after everything
        before them) until each service saw one on ``workers`` distinct worker
        processes: instead of sleeping and hoping nothing more arrives.
        """
        deadline = time.monotonic() + timeout
        sent = 0
        ours = f"{BARRIER}{uuid.uuid4().hex[:8]}-"  # this call's sentinels: an earlier barrier's do not count
        while True:
            sentinels = [line for line in self.all(barriers=True) if str(line.get("tag")).startswith(ours)]
            by_service = {service: [line for line in sentinels if line["service"] == service] for service in services}
            if all(len({line["pid"] for line in lines}) >= workers for lines in by_service.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"barrier not reached in {timeout:g}s: sentinels handled {by_service}")
            if all(len(lines) >= sent for lines in by_service.values()):  # the last sentinel arrived everywhere
                producer.fire("test.ping", [f"{ours}{sent}"], {})
                sent += 1
            time.sleep(0.05)  # a poll of the records file, bounded by the deadline above


#: RabbitMQ's Erlang runtime (no time warp mode, its default) follows a step of this machine's clock (NTP, a VM
#: resumed) by running its own clock, and the broker's timers with it, up to 1% fast or slow until the two agree
#: again. A wait the broker counted, measured by this machine's clock, can then end up to 1% early.
BROKER_CLOCK_CORRECTION = 0.01


def assert_broker_waited(waited: float, delay: float) -> None:
    """``waited`` seconds by this machine's clock for a ``delay`` the broker counted: never early by its clock."""
    assert waited >= delay * (1 - BROKER_CLOCK_CORRECTION), (waited, delay)


def wait_archived(archive: Any, count: int, timeout: float = 30.0) -> list[Any]:
    return wait_for(
        lambda: len(found := archive.list()) >= count and found,
        timeout,
        what=f"{count} archived messages in {archive.queue}",
    )


class Ran(subprocess.CompletedProcess):
    """A finished ``amqp-events`` process, read like Click's test result too (``exit_code``, ``output``)."""

    @property
    def exit_code(self) -> int:
        return self.returncode

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def load_service(module: str) -> Any:
    """The module of a test service (``services.orders``) run afresh, as a new process would import it: the
    settings it reads from the environment at import are this test's (its shared modules are kept)."""
    import importlib

    loaded = sys.modules.get(module)
    return importlib.reload(loaded) if loaded is not None else importlib.import_module(module)


def scrape(port: int) -> dict[str, float]:
    """``{'name{labels}': value}`` from a /metrics endpoint (labels sorted as exposed)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def value(metrics: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the series of ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, number in metrics.items():
        series, _, rest = key.partition("{")
        have = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if series == name and all(have.get(k) == v for k, v in labels.items()):
            total += number
    return total


@contextlib.contextmanager
def effects_tables(url: str) -> Iterator[Any]:
    """An engine on ``url`` with the test services' effects table and the inbox table created."""
    from services.effects import metadata
    from sqlalchemy import create_engine

    from amqp_events.inbox.sql import InboxTable

    engine = create_engine(url)
    metadata.create_all(engine)
    InboxTable(engine).create()
    try:
        yield engine
    finally:
        engine.dispose()


def effect_count(engine: Any, **where: str) -> int:
    """Rows of the test services' effects table (matching ``where``)."""
    from sqlalchemy import func, select, text

    query = select(func.count()).select_from(text("effects"))
    for column, value in where.items():
        query = query.where(text(f"{column} = :{column}").bindparams(**{column: value}))
    with engine.connect() as connection:
        return int(connection.execute(query).scalar_one())


def publish_twice(producer: EventsApp, event: str, tag: str, how: dict[str, Any] | None = None) -> str:
    """The same message (one event id) published twice, as a redelivery or a relay's retry would."""
    message = producer.event_message(event, [tag], {"how": how or {}})
    for _ in range(2):
        producer.transport.publish(message)
    return message.message_id


#: Debian's ``chromium``: Playwright drives it (its own browser download is not used).
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def queue_state(producer: EventsApp, queue: str) -> tuple[int, int]:
    """(ready messages, consumers) of ``queue``, exact, from a passive declare."""
    with producer.connection_for_read() as connection:
        declared = connection.default_channel.queue_declare(queue, passive=True)
        return declared.message_count, declared.consumer_count


def unconsumed(producer: EventsApp, queue: str, timeout: float = 30) -> int:
    """The ready messages of ``queue`` once the broker has let go of its consumers. A stopped worker's connection
    is closed before the broker has removed its consumers (and given back what they held): that is asynchronous."""
    wait_for(lambda: queue_state(producer, queue)[1] == 0, timeout, what=f"no consumer of {queue}")
    return queue_state(producer, queue)[0]


def celery(broker_url: str, *command: str, app: str = "services.orders", timeout: float = 60) -> Any:
    """``celery -A APP COMMAND...`` for the test's vhost, as an operator types it (a ``CompletedProcess``)."""
    env = {**os.environ, "BROKER_URL": broker_url, "PYTHONPATH": str(TESTS)}
    argv = [sys.executable, "-m", "celery", "-A", app, *command]
    return subprocess.run(argv, env=env, cwd=TESTS, capture_output=True, text=True, timeout=timeout)


def control(broker_url: str, *command: str, app: str = "services.orders") -> str:
    """``celery control COMMAND...``, which must succeed; what it said."""
    done = celery(broker_url, "control", *command, app=app)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def skip_outside_ci(reason: str) -> NoReturn:
    """Skip, saying why, on a developer's machine; fail in CI, where every tier must run."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)
