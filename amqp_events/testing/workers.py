"""Running ``celery worker`` processes from Python, and stopping exactly those (tests, demo, benchmarks)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from amqp_events.errors import WorkerStartError
from amqp_events.local.processes import alive, groups_gone, start_session

#: Flags every worker of this library should run with (docs/guides/production.md, "Running workers").
WORKER_FLAGS = ("--without-mingle", "--without-heartbeat", "--without-gossip")


def worker_argv(
    app: str, *extra: str, pool: str | None = "solo", concurrency: int = 1, name: str = "worker"
) -> list[str]:
    """``python -m celery -A app worker`` with the recommended flags (``pool=None``: no ``-P``, as users type it)."""
    return [
        sys.executable, "-m", "celery", "-A", app, "worker", *WORKER_FLAGS, *(["-P", pool] if pool else []),
        "-c", str(concurrency), "-n", f"{name}@%h", "--loglevel=INFO", *extra,
    ]  # fmt: skip


class WorkerProcess:
    """A ``celery worker`` subprocess in its own process group."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> None:
        self.argv, self.env, self.cwd, self.log_path = list(argv), dict(env), cwd, log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> WorkerProcess:
        with self.log_path.open("ab") as log:
            self._log_start = log.tell()  # a reused log file: only what this start writes counts
            self.process = start_session(
                self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def wait_ready(self, timeout: float = 60.0) -> WorkerProcess:
        """Wait for Celery's "ready." line; fail with the log tail if the worker exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.log()[self._log_start :]:
                return self
            if self.process is None or self.process.poll() is not None:
                raise WorkerStartError(f"worker {self.argv} exited during start-up:\n{self.log_tail()}")
            time.sleep(0.1)
        raise WorkerStartError(f"worker {self.argv} not ready after {timeout:g}s:\n{self.log_tail()}")

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
        """Warm shutdown (SIGTERM), then SIGKILL of the process group after ``timeout``; returns once no process
        of the group runs (a pool process that outlived the main one would still be connected, and consuming)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            if self.wait(timeout) is None:
                self._signal_group(signal.SIGKILL)
                self.wait(10)
        elif not alive(self.pid):
            # Pool children left behind by a crashed parent. While any is in its group, the kernel gives its number
            # to no new process; a process at that PID means the group is empty and the number was given again.
            self._signal_group(signal.SIGKILL)
        if not groups_gone([self.pid], 10.0):
            self._signal_group(signal.SIGKILL)
            groups_gone([self.pid], 10.0)
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
