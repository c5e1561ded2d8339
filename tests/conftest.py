"""Shared fixtures: test services, a producer app per test, and the records handlers write."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from amqp_events import EventsApp, events_app
from amqp_events.testing import json_lines, wait_for

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))


BARRIER = "barrier-"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by the servers they use: ``broker``, ``cluster``, ``database``. ``-m "not broker"``: the fast tier."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        on_a_broker = getattr(item, "callspec", None) and item.callspec.params.get("mode") == "broker"  # contract
        if "rabbitmq" in fixtures or "rabbitmq_cluster" in fixtures or on_a_broker:
            item.add_marker(pytest.mark.broker)
        if "rabbitmq_cluster" in fixtures:
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.xdist_group("cluster"))  # one cluster, whichever test process runs them
        if "postgres" in fixtures or "redis_server" in fixtures:
            item.add_marker(pytest.mark.database)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a grouped test that pytest-xdist did not group (it marks a grouped test's id ``...@group``): the tests
    of one group share what only one process may hold (a cluster, a fixed port)."""
    grouped = getattr(item.config.option, "loadgroup", False) and item.get_closest_marker("xdist_group")
    if grouped and "@" not in item.nodeid:
        pytest.fail("pytest-xdist ignored this test's xdist_group (see the pytest pin in pyproject.toml)")


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
        while True:
            sentinels = [line for line in self.all(barriers=True) if str(line.get("tag")).startswith(BARRIER)]
            by_service = {service: [line for line in sentinels if line["service"] == service] for service in services}
            if all(len({line["pid"] for line in lines}) >= workers for lines in by_service.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"barrier not reached in {timeout:g}s: sentinels handled {by_service}")
            if all(len(lines) >= sent for lines in by_service.values()):  # the last sentinel arrived everywhere
                producer.fire("test.ping", [f"{BARRIER}{sent}"], {})
                sent += 1
            time.sleep(0.05)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLAlchemy URL of an empty database for the test: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def records(tmp_path: Path) -> Records:
    return Records(tmp_path / "records.jsonl")


@pytest.fixture
def worker(start_worker: Callable[..., Any], records: Records) -> Callable[..., Any]:
    """``worker("orders")`` starts ``celery -A services.orders worker`` writing to ``records``."""

    def start(service: str, *extra: str, env: dict[str, str] | None = None, **options: Any) -> Any:
        environment = {"RECORD_FILE": str(records.path), "PYTHONPATH": str(TESTS), **(env or {})}
        return start_worker(f"services.{service}", *extra, env=environment, cwd=TESTS, **options)

    return start


@pytest.fixture
def producer(broker_url: str) -> Iterator[EventsApp]:
    """A pure producer app ("tests") on this test's vhost."""
    app = events_app("tests", broker_url=broker_url)
    yield app
    app.close()


@pytest.fixture
def archive_of(producer: EventsApp) -> Callable[[str], Any]:
    """``archive_of("orders")``: that service's archive, read through the test's producer app."""

    return producer.archive


def wait_archived(archive: Any, count: int, timeout: float = 30.0) -> list[Any]:
    return wait_for(
        lambda: len(found := archive.list()) >= count and found,
        timeout,
        what=f"{count} archived messages in {archive.queue}",
    )


@pytest.fixture
def cli(broker_url: str, monkeypatch: pytest.MonkeyPatch, rabbitmq: Any) -> Callable[..., Any]:
    """``cli("archive", "list")``: runs ``amqp-events -A services.orders ...`` in-process with Click's runner."""
    from click.testing import CliRunner

    from amqp_events.cli import main

    monkeypatch.setenv("BROKER_URL", broker_url)
    monkeypatch.setenv("AMQP_EVENTS_MANAGEMENT_URL", rabbitmq.management.base_url)
    runner = CliRunner()

    def invoke(*args: str, app: str | None = "services.orders", input: str | None = None) -> Any:
        # Each run loads the app afresh, as a new `amqp-events` process would.
        for name in [name for name in sys.modules if name == "services" or name.startswith("services.")]:
            del sys.modules[name]
        prefix = ["-A", app] if app else []
        return runner.invoke(main, [*prefix, *args], input=input, catch_exceptions=False)

    return invoke


#: The ``amqp-events`` command as installed beside this Python (the entry point a user runs).
AMQP_EVENTS = str(Path(sys.executable).parent / "amqp-events")


@pytest.fixture
def cli_process(broker_url: str, rabbitmq: Any) -> Callable[..., Any]:
    """``cli_process("archive", "list")``: runs the installed ``amqp-events -A services.orders ...`` in a
    process of its own (output captured as text, 120 s at most), in the test's environment as it is then."""
    fixed = {"BROKER_URL": broker_url, "PYTHONPATH": str(TESTS),
             "AMQP_EVENTS_MANAGEMENT_URL": rabbitmq.management.base_url}  # fmt: skip

    def run(
        *args: str, app: str | None = "services.orders", input: str | None = None, env: dict[str, str] | None = None
    ) -> Ran:
        prefix = ["-A", app] if app else []
        done = subprocess.run(
            [AMQP_EVENTS, *prefix, *args], env={**os.environ, **fixed, **(env or {})}, cwd=TESTS, input=input,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return Ran(done.args, done.returncode, done.stdout, done.stderr)

    return run


class Ran(subprocess.CompletedProcess):
    """A finished ``amqp-events`` process, read like Click's test result too (``exit_code``, ``output``)."""

    @property
    def exit_code(self) -> int:
        return self.returncode

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@pytest.fixture
def console(broker_url: str, rabbitmq: Any) -> Iterator[Any]:
    """``amqp-events console`` on a free loopback port, for this test's vhost."""
    from console_helpers import Console

    from amqp_events.local.processes import free_port

    started = Console(broker_url, rabbitmq.management.base_url, f"127.0.0.1:{free_port()}")
    yield started.wait_serving(started.url + "/api/services")
    started.stop()


@pytest.fixture
def service_app(broker_url: str, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Any]:
    """``service_app("orders")``: the app of ``services/orders.py``, imported afresh for this test's vhost."""
    monkeypatch.setenv("BROKER_URL", broker_url)
    apps = []

    def load(service: str) -> Any:
        apps.append(load_service(service))
        return apps[-1]

    yield load
    for app in apps:
        app.close()


def load_service(service: str) -> Any:
    """The app of ``services/<service>.py``, its module imported afresh (settings are read at import)."""
    import importlib

    for name in [name for name in sys.modules if name == "services" or name.startswith("services.")]:
        del sys.modules[name]
    return importlib.import_module(f"services.{service}").app


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


#: Debian's ``chromium``: Playwright drives it (its own browser download is not used).
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium, driven by Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()
