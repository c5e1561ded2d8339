"""Pytest fixtures for testing services: in-process, and against a real RabbitMQ node.

Enable them in a ``conftest.py`` with ``pytest_plugins = ["amqp_events.testing.fixtures"]``.

* ``in_process_events``: ``events = in_process_events(orders.app, shipping.app)``
  turns the in-process mode (:mod:`amqp_events.testing.in_process`) on for
  the rest of the test: no broker, no worker, a virtual clock.
* ``rabbitmq`` (session): a private throwaway node started in a temporary
  directory (see :mod:`amqp_events.local.broker`), or the broker at
  ``$AMQP_URL`` when that is set (its management API must be reachable, at
  ``$AMQP_MANAGEMENT_URL`` or on port 15672 of the same host). The private
  nodes run the machine's RabbitMQ, or the line ``$AMQP_EVENTS_RABBITMQ``
  names (``4.0``: see ``amqp-events broker install``).
* ``broker_url``: a fresh vhost for the test, deleted afterwards.
* ``rabbitmq_cluster`` (session): a private three-node cluster; ``cluster``: it,
  healed and with every node running again after the test; ``cluster_url``: a
  multi-host URL of a fresh vhost of it.
* ``postgres`` (session): a private PostgreSQL cluster; ``postgres_url``: a
  fresh database of it for the test.
* ``redis_server`` (session): a private Redis server; ``redis_url``: its
  database 0, emptied for the test.
* ``start_worker``: starts ``celery -A <module> worker`` processes for the
  test and stops exactly those (their process groups) afterwards. When a
  test fails, the tail of each worker's log is added to the report.

Every wait has a timeout.
"""

from __future__ import annotations

import contextlib
import os
import sys
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from amqp_events.celery.pointing import apps_pointed_at
from amqp_events.errors import LocalServerError, WorkerStartError
from amqp_events.local.broker import LocalBroker
from amqp_events.local.cluster import LocalCluster
from amqp_events.local.postgres import LocalPostgres
from amqp_events.local.redis import LocalRedis
from amqp_events.testing.in_process import InProcess, in_process
from amqp_events.testing.workers import WORKER_FLAGS, WorkerProcess, worker_argv
from amqp_events.transport.management import ManagementAPI


@dataclass
class Broker:
    """The broker tests run against: its AMQP URL template and management API."""

    amqp_url: str
    management: ManagementAPI
    node: LocalBroker | None = None

    def vhost_url(self, vhost: str) -> str:
        parts = urllib.parse.urlsplit(self.amqp_url)
        return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(vhost, safe="")))


@pytest.fixture
def in_process_events() -> Iterator[Callable[..., InProcess]]:
    """``in_process_events(*apps, unhandled="raise")``: the in-process mode for these apps until the test ends."""
    started: list[InProcess] = []

    def start(*apps: Any, **options: Any) -> InProcess:
        started.append(in_process(*apps, **options).start())
        return started[-1]

    yield start
    for events in reversed(started):
        events.stop()


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


@dataclass
class Cluster:
    """The three-node cluster a test runs against: its nodes (to kill and restart) and its management API."""

    nodes: LocalCluster

    @property
    def management(self) -> ManagementAPI:
        return self.nodes.management

    def vhost_url(self, vhost: str) -> str:
        return self.nodes.vhost_url(vhost)

    def partition(self, *indices: int) -> None:
        """Cut the nodes ``indices`` (0-based) off from the others; the test's end heals it."""
        self.nodes.partition(*indices)

    def heal(self) -> None:
        """Join the sides again and wait until every node runs the broker again (room for a stuck node's restart)."""
        self.nodes.heal()
        self.nodes.wait_until_running(timeout=240)

    def leader_of(self, vhost: str, queue: str) -> int:
        """The index of the node that leads ``queue`` now."""
        info = self.management.request("GET", f"/api/queues/{urllib.parse.quote(vhost, safe='')}/{queue}")
        return [self.nodes.node_name(n) for n in range(self.nodes.size)].index(info["leader"])


@pytest.fixture(scope="session")
def rabbitmq_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A private three-node RabbitMQ cluster for the session (about 25 s to start)."""
    nodes = LocalCluster(tmp_path_factory.mktemp("cluster"), 3)
    nodes.start()
    try:
        yield Cluster(nodes)
    finally:
        nodes.stop()


@pytest.fixture
def cluster(rabbitmq_cluster: Cluster) -> Iterator[Cluster]:
    """The session's cluster for one test: healed, and every node it killed or stopped running again afterwards."""
    yield rabbitmq_cluster
    _restore(rabbitmq_cluster)


def _restore(cluster: Cluster) -> None:
    """Heal the cluster and bring back every node a test killed or stopped (nothing to do when none was)."""
    healed = cluster.nodes.heal()
    if not all(node.is_running() for node in cluster.nodes.nodes):
        cluster.nodes.start()
    elif healed:  # the paused side comes back by itself
        cluster.nodes.wait_until_running()


@pytest.fixture
def cluster_url(cluster: Cluster) -> Iterator[str]:
    """A multi-host AMQP URL (every node) of a fresh vhost of the cluster, deleted afterwards."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    cluster.management.create_vhost(name)
    try:
        yield cluster.vhost_url(name)
    finally:
        # Every node back first: deleting a vhost whose quorum queues miss a member waits for the HTTP timeout.
        _restore(cluster)
        with contextlib.suppress(Exception):
            cluster.management.delete_vhost(name)


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """A private PostgreSQL cluster for the session (``initdb``/``pg_ctl``; stopped and removed afterwards)."""
    try:
        cluster = LocalPostgres()
    except LocalServerError as exc:
        pytest.skip(str(exc))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def postgres_url(postgres: LocalPostgres) -> str:
    """A SQLAlchemy URL (psycopg 3) of a fresh database for this test."""
    return postgres.create_database(f"test_{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    """A private Redis server for the session (Debian's ``redis-server``; stopped afterwards)."""
    try:
        server = LocalRedis()
    except LocalServerError as exc:
        pytest.skip(str(exc))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: LocalRedis) -> str:
    """A Redis URL of a database emptied for this test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    client.close()
    return redis_server.url


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
    runs with the recommended flags, and is stopped when the test ends. Until
    then, the apps of the test process written for the same broker as the
    worker's app (when the test imported its module) use this test's vhost too,
    so that what the test fires reaches the worker.
    ``as_written=True`` runs ``celery -A APP worker`` with the recommended
    flags only, as the documentation says (Celery's default pool, name and log
    level: it logs no "ready" line, so wait for its consumers instead).
    """
    workers: list[WorkerProcess] = []
    request.node.amqp_events_workers = workers
    pointed = contextlib.ExitStack()

    def start(
        app: str,
        *extra: str,
        pool: str = "solo",
        concurrency: int = 1,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        ready: bool = True,
        timeout: float = 60.0,
        as_written: bool = False,
    ) -> WorkerProcess:
        name = f"w{len(workers) + 1}-{uuid.uuid4().hex[:6]}"
        if as_written:
            argv = [sys.executable, "-m", "celery", "-A", app, "worker", *WORKER_FLAGS, *extra]
        else:
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
        # The test's own firing goes where the worker listens (the process's apps of that broker, until the end).
        pointed.enter_context(apps_pointed_at(environment["BROKER_URL"], app))
        if ready:
            try:
                worker.wait_ready(timeout)
            except WorkerStartError as exc:
                pytest.fail(str(exc))
        return worker

    with pointed:
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
