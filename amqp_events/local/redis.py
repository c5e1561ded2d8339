"""A private, throwaway Redis server (development and tests only).

``redis-server`` from Debian's package, on a free port (or the one given) of 127.0.0.1 with its
own directory and no persistence, as a plain process stopped by PID.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from amqp_events.errors import LocalServerError
from amqp_events.local.processes import free_port, start_session

INSTALL_HINT = "Redis is not installed: install Debian's package with `sudo apt-get install -y redis-server`"


class LocalRedis:
    """``with LocalRedis() as redis: redis.url`` (``redis://127.0.0.1:PORT/0``)."""

    def __init__(self, port: int | None = None) -> None:
        self.program = shutil.which("redis-server")
        if self.program is None:
            raise LocalServerError(INSTALL_HINT)
        self.directory = Path(tempfile.mkdtemp(prefix="amqp-events-redis-"))
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30.0) -> LocalRedis:
        argv = [str(self.program), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                "--save", "", "--appendonly", "no", "--daemonize", "no"]  # fmt: skip
        with (self.directory / "log").open("wb") as log:
            self.process = start_session(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LocalServerError(f"redis-server exited: {(self.directory / 'log').read_text(errors='replace')}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as connection:
                    connection.sendall(b"PING\r\n")
                    if connection.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise LocalServerError(f"redis-server did not answer within {timeout:g}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
