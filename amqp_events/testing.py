"""Pytest fixtures for testing services against a real RabbitMQ node.

Enable them in a ``conftest.py`` with ``pytest_plugins = ["amqp_events.testing"]``.

* ``rabbitmq`` (session): a private throwaway node started in a temporary
  directory (see :mod:`amqp_events.local_broker`), or the broker at
  ``$AMQP_URL`` when that is set (its management API must be reachable, at
  ``$AMQP_MANAGEMENT_URL`` or on port 15672 of the same host).
* ``broker_url``: a fresh vhost for the test, deleted afterwards.
* ``start_worker``: starts ``celery -A <module> worker`` processes for the
  test and stops exactly those (their process groups) afterwards. When a
  test fails, the tail of each worker's log is added to the report.

Every wait has a timeout.
"""

from __future__ import annotations

import os
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from amqp_events.local_broker import LocalBroker
from amqp_events.management import ManagementAPI
from amqp_events.worker_process import WorkerProcess, WorkerStartError, worker_argv

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 30.0, interval: float = 0.1, what: str = "") -> T:
    """Poll ``condition`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what or condition}")
        time.sleep(interval)


@dataclass
class Broker:
    """The broker tests run against: its AMQP URL template and management API."""

    amqp_url: str
    management: ManagementAPI
    node: LocalBroker | None = None

    def vhost_url(self, vhost: str) -> str:
        parts = urllib.parse.urlsplit(self.amqp_url)
        return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(vhost, safe="")))


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The session's broker: ``$AMQP_URL``, or a private node started for the session."""
    url = os.environ.get("AMQP_URL")
    if url:
        management_url = os.environ.get("AMQP_MANAGEMENT_URL")
        management = ManagementAPI(management_url) if management_url else ManagementAPI.for_amqp_url(url)
        yield Broker(url, management)
        return
    node = LocalBroker(tmp_path_factory.mktemp("rabbitmq"))
    node.start()
    try:
        yield Broker(node.url, node.management, node)
    finally:
        node.stop()


@pytest.fixture
def vhost(rabbitmq: Broker) -> Iterator[str]:
    """A fresh vhost for one test, deleted afterwards."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    rabbitmq.management.create_vhost(name)
    try:
        yield name
    finally:
        rabbitmq.management.delete_vhost(name)


@pytest.fixture
def broker_url(rabbitmq: Broker, vhost: str) -> str:
    """AMQP URL of this test's own vhost."""
    return rabbitmq.vhost_url(vhost)


@pytest.fixture
def start_worker(
    request: pytest.FixtureRequest, broker_url: str, tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    """``start_worker("orders.celery", pool="prefork", concurrency=2, env={...})`` -> a ready worker.

    The worker gets ``BROKER_URL`` (this test's vhost) in its environment,
    runs with the recommended flags, and is stopped when the test ends.
    """
    workers: list[WorkerProcess] = []
    request.node.amqp_events_workers = workers

    def start(
        app: str,
        *extra: str,
        pool: str = "solo",
        concurrency: int = 1,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        ready: bool = True,
        timeout: float = 60.0,
    ) -> WorkerProcess:
        name = f"w{len(workers) + 1}-{uuid.uuid4().hex[:6]}"
        argv = worker_argv(app, *extra, pool=pool, concurrency=concurrency, name=name)
        # TMPDIR: what a killed worker leaves behind stays in the test's own directory
        environment = {
            **os.environ,
            "BROKER_URL": broker_url,
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(tmp_path),
            **(env or {}),
        }
        worker = WorkerProcess(argv, environment, cwd or Path.cwd(), tmp_path / f"{name}.log")
        workers.append(worker.start())
        if ready:
            try:
                worker.wait_ready(timeout)
            except WorkerStartError as exc:
                pytest.fail(str(exc))
        return worker

    yield start
    for worker in workers:
        worker.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome: Any = yield
    report = outcome.get_result()
    workers = getattr(item, "amqp_events_workers", [])
    if report.failed and call.when == "call":
        for worker in workers:
            report.sections.append((f"worker log {' '.join(worker.argv[3:5])} pid {worker.pid}", worker.log_tail()))
