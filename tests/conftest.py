"""Shared fixtures: test services, a producer app per test, and the records handlers write."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from amqp_events import EventsApp, events_app
from amqp_events.testing import wait_for

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))


class Records:
    """The JSON lines test handlers append to ``$RECORD_FILE``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def all(self, **match: Any) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        return [line for line in lines if all(line.get(key) == value for key, value in match.items())]

    def wait(self, count: int, timeout: float = 30.0, **match: Any) -> list[dict[str, Any]]:
        """Wait until at least ``count`` records match; returns them."""
        return wait_for(
            lambda: (found := self.all(**match)) and len(found) >= count and found,
            timeout,
            what=f"{count} records matching {match} (have {len(self.all(**match))})",
        )


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
    from amqp_events.archive import Archive

    return lambda service: Archive(producer, service)


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


@pytest.fixture
def service_app(broker_url: str, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Any]:
    """``service_app("orders")``: the app of ``services/orders.py``, imported afresh for this test's vhost."""
    import importlib

    monkeypatch.setenv("BROKER_URL", broker_url)
    apps = []

    def load(service: str) -> Any:
        for name in [name for name in sys.modules if name == "services" or name.startswith("services.")]:
            del sys.modules[name]
        app = importlib.import_module(f"services.{service}").app
        apps.append(app)
        return app

    yield load
    for app in apps:
        app.close()
