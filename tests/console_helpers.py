"""The console in a process of its own, for the tests that drive it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from amqp_events.local.processes import terminate
from amqp_events.testing import wait_for

#: The ``amqp-events`` command as installed beside this Python.
AMQP_EVENTS = str(Path(sys.executable).parent / "amqp-events")


class Console:
    """``amqp-events console`` in a process of its own, stopped by its PID."""

    def __init__(
        self,
        broker_url: str,
        management_url: str,
        bind: str,
        env: dict[str, str] | None = None,
        app: str = "",
        options: tuple[str, ...] = ("--refresh", "0.5"),
    ) -> None:
        command = [AMQP_EVENTS, *(["-A", app] if app else []), "--broker", broker_url,
                   "--management-url", management_url, "console", "--bind", bind, *options]  # fmt: skip
        environment = {**os.environ, **(env or {})}
        self.url = f"http://{bind}"
        # A file, not a pipe: a pipe nobody reads fills up and the console blocks on its next line of log.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (kept open for the process's life, read on failure)
        self.process = subprocess.Popen(command, env=environment, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_serving(self, probe: str) -> Console:
        def serving() -> bool:
            assert self.process.poll() is None, self.output()
            try:
                urllib.request.urlopen(probe, timeout=2).close()
            except urllib.error.HTTPError:
                return True  # it answers (a 401 is an answer)
            except OSError:
                return False
            return True

        wait_for(serving, 30, what="the console serving")
        return self

    def output(self) -> str:
        """Everything it printed, once stopped."""
        self.stop()
        return self.log_tail(None)

    def log_tail(self, lines: int | None = 60) -> str:
        self.log.seek(0)
        printed = self.log.read().decode(errors="replace").splitlines()
        return "\n".join(printed if lines is None else printed[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            terminate(self.process.pid, 10)


def call(url: str, body: object = None, headers: dict[str, str] | None = None) -> tuple[int, object]:
    """``(status, JSON answer)`` of a GET (or a POST of ``body``)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
