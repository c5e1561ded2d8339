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

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from amqp_events.local_broker import LocalBroker
from amqp_events.management import ManagementAPI

T = TypeVar("T")

WORKER_FLAGS = ("--without-mingle", "--without-heartbeat", "--without-gossip")


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


class WorkerProcess:
    """A ``celery worker`` subprocess in its own process group."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> None:
        self.argv, self.env, self.cwd, self.log_path = list(argv), dict(env), cwd, log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> WorkerProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout: float = 60.0) -> WorkerProcess:
        """Wait for Celery's "ready." line; fail with the log tail if the worker exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.log():
                return self
            if self.process is None or self.process.poll() is not None:
                pytest.fail(f"worker {self.argv} exited during start-up:\n{self.log_tail()}")
            time.sleep(0.1)
        pytest.fail(f"worker {self.argv} not ready after {timeout:g}s:\n{self.log_tail()}")

    def children(self) -> list[int]:
        """PIDs of the worker's pool processes (prefork children)."""
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and pool), as a crash would."""
        self._signal_group(signal.SIGKILL)
        self.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        """Warm shutdown (SIGTERM), then SIGKILL of the process group after ``timeout``."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            if self.wait(timeout) is None:
                self._signal_group(signal.SIGKILL)
                self.wait(10)
        else:
            self._signal_group(signal.SIGKILL)  # pool children left behind by a crashed parent
        return self.process.returncode

    def wait(self, timeout: float) -> int | None:
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)


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
        argv = [
            sys.executable, "-m", "celery", "-A", app, "worker", *WORKER_FLAGS,
            "-P", pool, "-c", str(concurrency), "-n", f"{name}@%h", "--loglevel=INFO", *extra,
        ]  # fmt: skip
        environment = {**os.environ, "BROKER_URL": broker_url, "PYTHONUNBUFFERED": "1", **(env or {})}
        worker = WorkerProcess(argv, environment, cwd or Path.cwd(), tmp_path / f"{name}.log")
        workers.append(worker.start())
        return worker.wait_ready(timeout) if ready else worker

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
