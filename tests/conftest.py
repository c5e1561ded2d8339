"""Shared fixtures: test services, a producer app per test, the records handlers write, the command line, the
console and a browser (what the tests share besides fixtures is in ``helpers.py``)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from amqp_events import EventsApp, events_app

sys.path.insert(0, str(Path(__file__).parent))  # the suite's helper modules, for every test module

from helpers import AMQP_EVENTS, CHROMIUM, TESTS, Ran, Records, load_service

# No test asserts wall-clock time: Hypothesis's per-example deadline (200 ms) would fail an example that a loaded
# machine (the broker tests running beside it) merely slowed down.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


#: The test modules whose outcome depends on the RabbitMQ line, and how: their broker tests run on every supported
#: line (``every_line``: ``scripts/test`` runs them on the other line too); the rest exercise the library over what
#: both lines do alike, and run on the machine's line. In a module where only some tests depend on the line, each
#: of those says so itself: ``@pytest.mark.line_dependent("what of the broker")``.
ON_EVERY_LINE = {
    "test_isolation": "the dead-lettering headers a sender can forge (3.10 keeps a sender's x-first-death-*)",
    "test_least_privilege": "permissions, topic authorisation and user_id validation",
    "test_security": "permissions and user_id validation",
    "test_hostile_input": "frame, header and message size limits (4.0: 16 MiB messages)",
    "test_bad_input": "what the broker lets through of malformed messages",
    "test_fuzz": "what the broker lets through of hostile messages",
    "test_retries": "per-message TTL and dead-lettering on the delay ladder",
    "test_archive": "x-death, dead-lettering and queue length limits",
    "test_acks": "acks, multiple acks and rejects on a channel",
    "test_worker_lost": "redelivery counts (quorum queues' delivery count and limit)",
    "test_durability": "what a crashed node keeps and recovers",
    "test_prefetch": "QoS (4.0 refuses a global prefetch on quorum queues)",
    "test_flow_control": "the windows kept on the broker (message TTL, queue length)",
    "test_flow_waiting": "a queue consumed at a prefetch of its own",
    "test_history": "streams",
    "test_console_groups": "the management API, remote control",
    "test_metrics": "the management API",
    "test_monitoring": "the management API and Prometheus' scrape of the node",
    "test_queue_layouts": "declare arguments' equivalence",
    "test_layout_move": "moving messages between queues of both kinds",
    "test_local_broker": "starting and stopping a node of the line",
    "test_celery_operators": "Celery's remote control queues (transient, auto-deleted)",
    "test_celery_compat": "Celery's QoS and queue declarations",
    "test_consuming_pool": "consumers per process, cancelled and resumed",
    "test_ordered": "single-active-consumer partitions",
}
#: A worker's own parameters: the broker sees the same on every line whichever is chosen, so on the other line a test
#: of ON_EVERY_LINE runs at the first value of each (its other values run on the machine's line).
WORKER_SIDE = ("pool", "coroutines")


def on_every_line(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    if module is None:
        return False
    if module.__name__.rpartition(".")[2] not in ON_EVERY_LINE and item.get_closest_marker("line_dependent") is None:
        return False
    indices = getattr(getattr(item, "callspec", None), "indices", {})
    return all(indices.get(name, 0) == 0 for name in WORKER_SIDE)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by the servers they use: ``broker``, ``cluster``, ``database``; and ``every_line`` (see
    :data:`ON_EVERY_LINE` and :data:`WORKER_SIDE`). ``-m "not broker"``: the fast tier."""
    for item in items:
        if on_every_line(item):
            item.add_marker(pytest.mark.every_line)
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


@pytest.fixture
def cli(broker_url: str, monkeypatch: pytest.MonkeyPatch, rabbitmq: Any) -> Callable[..., Any]:
    """``cli("archive", "list")``: runs ``amqp-events -A services.orders ...`` in-process with Click's runner."""
    from click.testing import CliRunner

    from amqp_events.cli import main

    monkeypatch.setenv("BROKER_URL", broker_url)
    monkeypatch.setenv("AMQP_EVENTS_MANAGEMENT_URL", rabbitmq.management.base_url)
    runner = CliRunner()

    def invoke(*args: str, app: str | None = "services.orders", input: str | None = None) -> Any:
        loaded = sys.modules.get(app.partition(":")[0]) if app else None
        if loaded is not None:  # run afresh, as a new `amqp-events` process would import it
            importlib.reload(loaded)
        prefix = ["-A", app] if app else []
        return runner.invoke(main, [*prefix, *args], input=input, catch_exceptions=False)

    return invoke


#: The ``amqp-events`` command as installed beside this Python (the entry point a user runs).
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    """A failed test that used the ``console`` fixture reports what the console printed (as a worker's log)."""
    outcome: Any = yield
    report = outcome.get_result()
    console = getattr(item, "funcargs", {}).get("console")
    if report.failed and call.when == "call" and console is not None:
        code = console.process.poll()
        state = "running" if code is None else f"exited with {code}"
        report.sections.append((f"console log pid {console.process.pid} ({state})", console.log_tail()))


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
        apps.append(load_service(f"services.{service}").app)
        return apps[-1]

    yield load
    for app in apps:
        app.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium, driven by Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()
