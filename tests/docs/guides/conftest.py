"""The guides tier: each page's code run as its reader runs it.

A page's files are written exactly as printed (nothing rewritten), into a directory of their own, and run with
the commands the page gives, from a virtualenv holding the library (installed from this checkout, as getting
started says) with only what the page tells its reader to install. The servers sit where the pages say they
are: a RabbitMQ node that ``amqp-events broker start`` puts on localhost:5672 (its management API where that
command says), PostgreSQL on localhost:5432
with the pages' roles and databases, Redis on localhost:6379. Those ports are the pages' own, so the tier runs in
one test process (one xdist group, with the tests of ``amqp-events broker start`` that would take 5672) and is
skipped, saying why, when another program holds a port it needs (in CI, where ``$CI`` is set, that fails).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
from docs_pages import EXAMPLE_BROKER, ROOT, code_blocks, page
from helpers import skip_outside_ci
from kombu import Connection

from amqp_events import EventsApp, events_app
from amqp_events.errors import LocalServerError
from amqp_events.local.postgres import LocalPostgres
from amqp_events.local.processes import STARTED, start_session
from amqp_events.local.redis import LocalRedis
from amqp_events.testing import wait_for
from amqp_events.testing.workers import WorkerProcess
from amqp_events.transport.management import ManagementAPI

#: The databases the pages' URLs name (``postgresql+psycopg://shop@localhost/shop``): role and database alike.
DATABASES = ("shop", "payments")

T = TypeVar("T")


#: What getting started installs, and every page takes as read.
LIBRARY = "celery-amqp-events>=0.3"


def installs_named(text: str) -> tuple[list[str], list[str]]:
    """The library as a page's ``pip install`` commands name it (its extras, its version: each page's own line
    names the version), and the other packages they name."""
    extras: set[str] = set()
    packages: set[str] = set()
    versions: set[str] = set()
    for command in re.findall(r"pip install ([^`\n]+)", text):
        for word in shlex.split(command.split(")")[0]):
            if word.startswith("-"):
                continue
            if word.startswith("celery-amqp-events"):
                extras.update(re.findall(r"\[([\w,-]+)\]", word)[0].split(",") if "[" in word else ())
                versions.update(re.findall(r"([<>=!~].*)$", word.split("]")[-1]))
            elif re.fullmatch(r"[A-Za-z][\w.-]*", word):
                packages.add(word)
    assert len(versions) <= 1, f"a page names the library's version more than one way: {versions}"
    version = versions.pop() if versions else LIBRARY.removeprefix("celery-amqp-events")
    library = f"celery-amqp-events{'[' + ','.join(sorted(extras)) + ']' if extras else ''}{version}"
    return [library], sorted(packages)


refused = skip_outside_ci


def port_taken(port: int) -> bool:
    with contextlib.closing(socket.socket()) as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


class Virtualenvs:
    """One virtualenv per set of installs, made on first use and kept for the session: the pages' own install
    lines, the library taken from the built package in ``dist`` (``--find-links``: where it comes from is all
    that differs from a reader's install, until it is on the package index)."""

    def __init__(self, directory: Path, dist: Path) -> None:
        self.directory, self.dist = directory, dist

    def bin(self, library: list[str], packages: list[str]) -> Path:
        place = self.directory / re.sub(r"[^\w.,-]+", "_", "-".join([*library, *packages]))
        if not (place / "bin" / "amqp-events").exists():
            subprocess.run([sys.executable, "-m", "venv", str(place)], check=True, timeout=120)
            installed = subprocess.run(
                [place / "bin" / "pip", "install", "-q", "--disable-pip-version-check", "--find-links", self.dist,
                 *library, *packages],
                capture_output=True, text=True, timeout=900,
            )  # fmt: skip
            assert installed.returncode == 0, installed.stdout + installed.stderr
        return place / "bin"


@dataclass
class Servers:
    """The servers at the pages' addresses, and the environment a reader's shell would have."""

    home: Path
    virtualenvs: Virtualenvs
    broker: ManagementAPI
    postgres: LocalPostgres | None = None
    redis: LocalRedis | None = None


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    if port_taken(5672):
        refused("another program holds localhost:5672, where the guides say the broker is")
    home = tmp_path_factory.mktemp("guides")
    virtualenvs = Virtualenvs(home / "venvs", built_package(home / "dist"))
    amqp_events = virtualenvs.bin([LIBRARY], []) / "amqp-events"
    environment = {**reader_environment(), "XDG_CACHE_HOME": str(home / "cache")}
    started = subprocess.run([amqp_events, "broker", "start"], cwd=home, env=environment, capture_output=True,
                             text=True, timeout=180)  # fmt: skip
    found = Servers(home, virtualenvs, ManagementAPI(management_url(started.stdout), "guest", "guest"))
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert "broker running: amqp://guest:guest@127.0.0.1:5672/" in started.stdout, started.stdout
        yield found
    finally:
        subprocess.run([amqp_events, "broker", "stop"], cwd=home, env=environment, timeout=120)
        for server in (found.postgres, found.redis):
            if server is not None:
                server.stop()


def built_package(directory: Path) -> Path:
    """Where the package's wheel is: ``$AMQP_EVENTS_DIST`` (what ``scripts/dist`` built and checked: CI), or one
    built from this checkout into ``directory``."""
    given = os.environ.get("AMQP_EVENTS_DIST")
    if given:
        return Path(given)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(directory), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    return directory


def management_url(said: str) -> str:
    """Where ``amqp-events broker start`` says the management API is."""
    found = re.findall(r"management UI: +(\S+) ", said)
    return found[0] if found else "http://127.0.0.1:15672/"


def reader_environment() -> dict[str, str]:
    """This process's environment without what points at the test suite's own checkout, brokers or settings; but
    where to write down the servers a page's commands start (``amqp-events broker start``), so that an interrupted
    run stops them too."""
    kept = (STARTED,)
    return {
        name: value
        for name, value in os.environ.items()
        if name in kept
        or (name not in ("PYTHONPATH", "VIRTUAL_ENV", "BROKER_URL") and not name.startswith(("AMQP_", "PYTEST_")))
    }


@dataclass
class Guide:
    """One page as its reader follows it: its files in ``directory``, its commands from its virtualenv."""

    path: str
    directory: Path
    bin: Path
    env: dict[str, str]
    workers: list[WorkerProcess]
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return page(self.path)

    def write(self, *names: str) -> None:
        """The page's files ``names`` as printed (a file in a folder makes the folder a package)."""
        blocks = code_blocks()
        for name in names:
            assert name in blocks, f"no file {name} on any page"
            path = self.directory / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(blocks[name])
            if path.parent != self.directory and path.parent.name != "tests":
                (path.parent / "__init__.py").touch()

    def line(self, starting: str) -> str:
        """The page's one command line that starts with ``starting``."""
        found = [line.strip() for line in self.text.splitlines() if line.strip().startswith(starting)]
        assert len(found) == 1, f"{self.path}: {len(found)} lines start with {starting!r}"
        return found[0]

    def run(self, command: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A command as the page spells it, from the page's virtualenv, in the page's directory."""
        env, argv = self._argv(command)
        done = subprocess.run(argv, cwd=self.directory, env=env, capture_output=True, text=True, timeout=timeout)
        assert not check or done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        return done

    def python(self, *statements: str) -> subprocess.CompletedProcess[str]:
        """``python -c "..."``: the reader's own lines (``statements`` joined by ``; ``) in the page's virtualenv."""
        return self.run(f"python -c {shlex.quote('; '.join(statements))}")

    def start(self, command: str) -> subprocess.Popen[str]:
        """A long-running command (a relay, an exporter); the test's end stops it."""
        env, argv = self._argv(command)
        process = start_session(
            argv, cwd=self.directory, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.processes.append(process)
        return process

    def worker(
        self, command: str, *queues: str, env: dict[str, str] | None = None, flags: tuple[str, ...] = ()
    ) -> WorkerProcess:
        """``celery -A ... worker ...`` exactly as the page gives it (with the reader's ``flags``, such as a log
        level the page asks for), ready once each of ``queues`` has a consumer."""
        # The later pages take getting started's worker command as read.
        assert command in self.text or command in page("getting-started.md").replace("orders.celery", app_of(command))

        log = self.directory / f"worker-{len(self.workers) + 1}.log"
        given, argv = self._argv(command)
        worker = WorkerProcess([*argv, *flags], {**given, **(env or {})}, self.directory, log).start()
        self.workers.append(worker)

        def consumed() -> bool:
            try:
                return all(self.queue(queue)[1] for queue in queues)
            except Exception:  # not declared yet
                return False

        wait_for(lambda: consumed() or not worker.is_running(), 60, interval=0.3, what=f"consumers on {queues}")
        assert worker.is_running(), worker.log_tail()
        return worker

    @staticmethod
    def queue(name: str) -> tuple[int, int]:
        """``(messages ready, consumers)`` of a queue, exactly (a passive declare; the management API lags)."""
        with Connection(EXAMPLE_BROKER) as connection:
            declared = connection.default_channel.queue_declare(name, passive=True)
            return declared.message_count, declared.consumer_count

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 15)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.communicate(timeout=30)

    def _argv(self, command: str) -> tuple[dict[str, str], list[str]]:
        """The environment and the program's arguments of a command line as a shell reads it (``NAME=value``
        words before the program set its environment)."""
        argv = shlex.split(command, comments=True)
        env = dict(self.env)
        while argv and re.fullmatch(r"[A-Za-z_]\w*=.*", argv[0]):
            name, _, value = argv.pop(0).partition("=")
            env[name] = value
        program = shutil.which(argv[0], path=self.env["PATH"])
        assert program is not None, f"{argv[0]} is not installed by what {self.path} names"
        return env, [program, *argv[1:]]


@pytest.fixture
def guide(servers: Servers, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[str], Guide]]:
    """``guide("guides/outbox.md")``: the page's reader, on a broker emptied for this test."""
    servers.broker.delete_vhost("/")
    servers.broker.create_vhost("/")
    opened: list[Guide] = []
    workers: list[WorkerProcess] = []
    request.node.amqp_events_workers = workers  # their logs join a failed test's report

    def open_page(path: str) -> Guide:
        bin_directory = servers.virtualenvs.bin(*installs_named(page(path)))
        environment = {
            **reader_environment(),
            "PATH": f"{bin_directory}{os.pathsep}{os.environ['PATH']}",
            "XDG_CACHE_HOME": str(servers.home / "cache"),
            "PYTHONUNBUFFERED": "1",
        }
        opened.append(Guide(path, tmp_path, bin_directory, environment, workers))
        return opened[-1]

    yield open_page
    for each in opened:
        each.stop()


@pytest.fixture
def producer(servers: Servers) -> Iterator[EventsApp]:
    """A pure producer app ("tests") on the broker the pages name."""
    app = events_app("tests", broker_url=EXAMPLE_BROKER)
    yield app
    app.close()


def app_of(command: str) -> str:
    return shlex.split(command)[shlex.split(command).index("-A") + 1]


@pytest.fixture
def databases(servers: Servers) -> LocalPostgres:
    """PostgreSQL on localhost:5432 with the pages' roles and databases (each owned by its role, no password)."""
    if servers.postgres is None:
        servers.postgres = started_at(5432, "PostgreSQL", lambda: LocalPostgres(port=5432).start())
        for name in DATABASES:
            servers.postgres.create_database(name, owner=name)
    return servers.postgres


@pytest.fixture
def redis_as_written(servers: Servers) -> LocalRedis:
    """Redis on localhost:6379."""
    if servers.redis is None:
        servers.redis = started_at(6379, "Redis", lambda: LocalRedis(port=6379).start())
    return servers.redis


@pytest.fixture
def api_ports(servers: Servers) -> tuple[int, int]:
    """localhost:8000 and :8001, where the asyncio page serves its two APIs (free before the test)."""
    for port in (8000, 8001):
        if port_taken(port):
            refused(f"another program holds localhost:{port}, where the asyncio page serves an API")
    return 8000, 8001


def started_at(port: int, what: str, start: Callable[[], T]) -> T:
    """A server the session starts on the port the pages give (skipped where it is not installed)."""
    if port_taken(port):
        refused(f"another program holds localhost:{port}, where the guides say {what} is")
    try:
        return start()
    except LocalServerError as exc:
        pytest.skip(str(exc))
