"""The two modes the contract runs in (tests/broker/test_contract.py): the in-process mode, and a real broker with
real workers. A scenario drives the test services through a :class:`Mode`; the ``mode`` fixture gives each."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

import pytest
from helpers import Records, assert_broker_waited, load_service

from amqp_events import EventsApp, events_app
from amqp_events.archive import Archive, ArchivedMessage
from amqp_events.testing import wait_for
from amqp_events.testing.in_process import InProcess, in_process
from amqp_events.topology.names import handler_queue_name


class Mode:
    """How a scenario runs: start services, fire, wait until something holds, read an archive."""

    exact_times: bool
    producer: EventsApp
    #: A worker as typed: the default pool's two processes.
    typed = False

    def start(self, *services: str, env: dict[str, str] | None = None) -> None:
        raise NotImplementedError

    def until(self, condition: Callable[[], Any], timeout: float = 60.0) -> None:
        """Return once ``condition()`` holds (in-process: once everything due was handled)."""
        raise NotImplementedError

    def quiet(self, services: tuple[str, ...]) -> None:
        """Return once everything fired so far for ``services`` was handled: then counts are final."""
        raise NotImplementedError

    def deploy_fix(self, *services: str) -> None:
        """The failing handlers are fixed from now on (``FIXED=1``)."""
        raise NotImplementedError

    def module(self, service: str) -> Any:
        """The module of ``services/<service>.py`` whose app fires into this mode."""
        raise NotImplementedError

    def archive(self, service: str) -> Archive:
        return self.producer.archive(service)

    def assert_waited(self, waited: float, delay: float) -> None:
        """``waited`` seconds between two runs that ``delay`` separates: exactly so in-process, never less."""
        if self.exact_times:
            assert waited == delay, (waited, delay)
        else:
            assert_broker_waited(waited, delay)


class InProcessMode(Mode):
    exact_times = True

    def __init__(self, monkeypatch: pytest.MonkeyPatch, coroutines: bool = False) -> None:
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("BROKER_URL", "amqp://in-process.invalid//")  # never connected to
        if coroutines:  # the test services' handlers as coroutines, run on the in-process mode's clock
            monkeypatch.setenv("COROUTINES", "1")
        self.events: InProcess | None = None
        self.services: list[str] = []
        self.modules: dict[str, Any] = {}

    def start(self, *services: str, env: dict[str, str] | None = None) -> None:
        for key, value in (env or {}).items():
            self.monkeypatch.setenv(key, value)
        self.services = list(services)
        self._switch_on()

    def _switch_on(self) -> None:
        self.stop()
        self.producer = events_app("tests", broker_url=os.environ["BROKER_URL"])
        for service in self.services:
            self.modules[service] = load_service(f"services.{service}")
        apps = [module.app for module in self.modules.values()]
        self.events = in_process(self.producer, *apps, unhandled="ignore").start()

    def module(self, service: str) -> Any:
        return self.modules[service]

    def until(self, condition: Callable[[], Any], timeout: float = 60.0) -> None:
        assert self.events is not None
        self.events.drain()
        assert condition()

    def quiet(self, services: tuple[str, ...]) -> None:
        assert self.events is not None
        self.events.drain()

    def deploy_fix(self, *services: str) -> None:
        self.monkeypatch.setenv("FIXED", "1")  # read by the handlers at each run

    def stop(self) -> None:
        if self.events is not None:
            self.events.stop()
            self.events = None


class BrokerMode(Mode):
    exact_times = False

    def __init__(
        self,
        worker: Callable[..., Any],
        producer: EventsApp,
        records: Records,
        service_app: Callable[[str], Any],
        monkeypatch: pytest.MonkeyPatch,
        coroutines: bool = False,
        typed: bool = False,
    ) -> None:
        self.worker, self.producer, self.records, self.service_app = worker, producer, records, service_app
        self.monkeypatch = monkeypatch
        self.processes: dict[str, Any] = {}
        self.env: dict[str, str] = {}
        #: The test services' handlers as coroutines (``COROUTINES=1``), on the worker's event loop.
        self.coroutines = coroutines
        #: Workers started as typed, ``celery -A <service> worker -c 2`` (the consuming pool's two processes).
        self.typed = typed

    def start_worker(self, service: str, env: dict[str, str]) -> Any:
        if self.typed:
            return self.worker(service, "-c", "2", "--loglevel=INFO", as_written=True, env=env)
        return self.worker(service, env=env)

    def start(self, *services: str, env: dict[str, str] | None = None) -> None:
        self.env = {**({"COROUTINES": "1"} if self.coroutines else {}), **(env or {})}
        for key, value in self.env.items():  # the services' modules loaded here (module()) configured alike
            self.monkeypatch.setenv(key, value)
        for service in services:
            self.processes[service] = self.start_worker(service, self.env)

    def until(self, condition: Callable[[], Any], timeout: float = 60.0) -> None:
        wait_for(condition, timeout, what=getattr(condition, "__doc__", None) or "the scenario's condition")

    def quiet(self, services: tuple[str, ...]) -> None:
        self.records.barrier(self.producer, services, workers=2 if self.typed else 1)

    def module(self, service: str) -> Any:
        self.service_app(service)  # loaded afresh for this test's vhost, closed with the test
        return importlib.import_module(f"services.{service}")

    def deploy_fix(self, *services: str) -> None:
        for service in services:
            self.processes.pop(service).stop()
            self.processes[service] = self.start_worker(service, {**self.env, "FIXED": "1"})


def archived_in(mode: Mode, service: str, count: int) -> list[ArchivedMessage]:
    """The ``count`` messages of ``service``'s archive, once there are that many (and no more)."""
    archive = mode.archive(service)
    mode.until(lambda: len(archive.list()) >= count)
    found = archive.list()
    assert len(found) == count, found
    return found


def queue_of(service: str, task: str) -> str:
    """The queue of ``service``'s handler ``task`` in the layout the suite runs in (``$AMQP_EVENTS_QUEUE_LAYOUT``)."""
    return handler_queue_name(service, task, os.environ.get("AMQP_EVENTS_QUEUE_LAYOUT") or "per_handler")
