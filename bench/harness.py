"""What every benchmark scenario needs: a private broker, a vhost each, workers, marks, the 0.1.0 venv."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from kombu import Connection

from amqp_events.local.broker import LocalBroker
from amqp_events.local.cluster import LocalCluster
from amqp_events.testing import json_lines
from amqp_events.testing.workers import WorkerProcess, worker_argv
from amqp_events.transport.management import ManagementAPI

T = TypeVar("T")

BENCH = Path(__file__).resolve().parent
APPS = BENCH / "apps"
LEGACY_VENV = BENCH / ".legacy-venv"
LEGACY_VERSION = "0.1.0"
#: The oldest supported Celery minor line (the newest is the one installed in .venv).
OLDEST_CELERY_LINE = "5.5"
#: Same for every library so that only the library differs.
PREFETCH_MULTIPLIER = "16"


@dataclass
class Run:
    """One scenario's vhost on the benchmark broker, with a file the handlers write their marks to."""

    url: str
    vhost: str
    marks: Path
    workdir: Path
    #: Queue type of the plain Celery baseline (bench/apps/plain.py reads PLAIN_QUEUE_TYPE).
    plain_queue_type: str = "classic"
    #: More environment for every process the run starts (e.g. ``MARK_EVERY``).
    extra_env: dict[str, str] = field(default_factory=dict)

    def marks_read(self) -> list[dict]:
        return json_lines(self.marks)

    def env(self, service: str = "bench") -> dict[str, str]:
        return {
            **os.environ,
            "BROKER_URL": self.url,
            "MARKS_FILE": str(self.marks),
            "SERVICE": service,
            "PLAIN_QUEUE_TYPE": self.plain_queue_type,
            "PYTHONPATH": f"{APPS}{os.pathsep}{BENCH.parent}",  # this tree's package, whatever is installed
            **self.extra_env,
        }

    def queue_depth(self, queue: str) -> int:
        with Connection(self.url) as connection:
            return int(connection.default_channel.queue_declare(queue, passive=True).message_count)

    def wait_depth(self, queue: str, at_least: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.queue_depth(queue) < at_least:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{queue} never reached {at_least} messages")
            time.sleep(0.2)

    def wait_marks(self, predicate, timeout: float = 300) -> list[dict]:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            marks = self.marks_read()
            if predicate(marks):
                return marks
            time.sleep(0.1)
        raise TimeoutError(f"marks never satisfied {predicate} in {self.marks}")

    @contextlib.contextmanager
    def process(
        self, name: str, argv: list[str], ready: str, times: int = 1, env: dict[str, str] | None = None
    ) -> Iterator[None]:
        """Another consumer (FastStream, a raw one) as a process of its own, stopped by PID (its process
        group); ready once its log says ``ready`` ``times`` times."""
        log = self.workdir / f"{name}-{uuid.uuid4().hex[:6]}.log"
        process = WorkerProcess(argv, {**self.env(), **(env or {})}, APPS, log).start()
        try:
            deadline = time.monotonic() + 120
            while process.log().count(ready) < times:
                if time.monotonic() > deadline or not process.is_running():
                    raise RuntimeError(f"{name} not ready:\n{process.log_tail()}")
                time.sleep(0.1)
            yield
        finally:
            process.stop()

    @contextlib.contextmanager
    def worker(
        self,
        app: str,
        pool: str | None = "solo",
        concurrency: int = 1,
        python: str = sys.executable,
        service: str = "bench",
        env: dict[str, str] | None = None,
        prefetch_multiplier: str = PREFETCH_MULTIPLIER,
        typed: bool = False,
    ) -> Iterator[WorkerProcess]:
        """A worker; ``typed``: at Celery's own log level (warning), as the command is typed, which logs no "ready"
        line (the drains it serves are timed by their marks, not from its start)."""
        name = f"{app}-{service}-{pool}-{uuid.uuid4().hex[:6]}"
        argv = worker_argv(
            app, "--prefetch-multiplier", prefetch_multiplier, pool=pool, concurrency=concurrency, name=name
        )
        if typed:
            argv.remove("--loglevel=INFO")
        argv[0] = python
        log = self.workdir / f"{name}.log"
        environment = {**self.env(service), **(env or {})}
        if Path(python).is_relative_to(LEGACY_VENV):  # 0.1.0 imports its own package, not this tree's
            environment["PYTHONPATH"] = str(APPS)
        worker = WorkerProcess(argv, environment, APPS, log).start()
        try:
            if not typed:
                worker.wait_ready(120)
            yield worker
        finally:
            worker.stop()


class Bench:
    """The benchmark broker: a private node, one vhost per run."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.node = LocalBroker(workdir / "broker")

    def __enter__(self) -> Bench:
        self.node.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.node.stop()

    @contextlib.contextmanager
    def run(self, name: str, broker: LocalBroker | LocalCluster | None = None) -> Iterator[Run]:
        """A vhost of its own on the benchmark node (or on ``broker``, a cluster) for one measurement."""
        broker = broker or self.node
        vhost = f"{name}-{uuid.uuid4().hex[:8]}"
        broker.management.create_vhost(vhost)
        try:
            yield Run(broker.vhost_url(vhost), vhost, self.workdir / f"{vhost}.marks", self.workdir)
        finally:
            # A fleet's thousands of quorum queues on a cluster take minutes to delete, past the API's usual 30 s.
            ManagementAPI(broker.management.base_url, timeout=900).delete_vhost(vhost)


def throughput(marks: list[dict], count: int) -> float:
    """Handled per second between the first event's mark and the last one's."""
    first = min(mark["time"] for mark in marks if mark["n"] == 0)
    last = max(mark["time"] for mark in marks if mark["last"])
    return count / (last - first)


def steady_throughput(marks: list[dict], count: int) -> float:
    """Handled per second between the marks of the events at 10% and at 90% of the backlog (``MARK_EVERY``):
    processes that start a moment apart, and the last ones' tail, do not count."""
    times = {mark["n"]: mark["time"] for mark in marks}
    low = min(times, key=lambda n: abs(n - count // 10))
    high = min(times, key=lambda n: abs(n - count * 9 // 10))
    return (high - low) / (times[high] - times[low])


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def in_turn(contenders: Sequence[T], round_: int) -> list[T]:
    """``contenders`` in the order round ``round_`` runs them: each first in turn, so that none always goes first
    (onto a fresh node, or after the others warmed it)."""
    at = round_ % len(contenders)
    return [*contenders[at:], *contenders[:at]]


def legacy_python() -> str:
    """A virtualenv with celery-amqp-events 0.1.0 from PyPI and this project's Celery, made once.

    It must be a virtualenv of its own: 0.1.0 has the same import name.
    """
    python = LEGACY_VENV / "bin" / "python"
    if not python.exists():
        import celery

        subprocess.run([sys.executable, "-m", "venv", str(LEGACY_VENV)], check=True)
        subprocess.run(
            [
                str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                f"celery-amqp-events=={LEGACY_VERSION}", f"celery=={celery.__version__}",
            ],
            check=True,
        )  # fmt: skip
    return str(python)


def celery_line_python(line: str) -> str:
    """The python of a virtualenv with this project and Celery ``line`` (made by scripts/venv-celery)."""
    done = subprocess.run(
        ["bash", str(BENCH.parent / "scripts" / "venv-celery"), line], capture_output=True, text=True, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def celery_version(python: str) -> str:
    done = subprocess.run([python, "-c", "import celery; print(celery.__version__)"], capture_output=True, text=True)
    return done.stdout.strip()


def legacy(run: Run, script: str, *args: str) -> dict:
    """Run ``bench/apps/<script>`` with 0.1.0's interpreter; it prints one JSON object."""
    done = subprocess.run(
        [legacy_python(), str(APPS / script), *args],
        env={**run.env(), "PYTHONPATH": str(APPS)},
        cwd=APPS,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script} failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))
