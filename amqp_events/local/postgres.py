"""A private, throwaway PostgreSQL cluster (development and tests only).

``initdb`` into a directory of its own, ``pg_ctl start`` on a free port (or the one given) of
127.0.0.1 with its socket in that directory, stopped by PID. PostgreSQL
refuses to run as root: when this process is root, its commands run as the
``postgres`` user of the Debian package, and the directory is given to it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from amqp_events.errors import LocalServerError
from amqp_events.local import processes
from amqp_events.local.processes import free_port

INSTALL_HINT = (
    "PostgreSQL is not installed: install Debian's package with "
    "`sudo apt-get install -y postgresql` (the system service does not need to run)"
)


def postgres_bin() -> Path:
    """The newest installed ``/usr/lib/postgresql/<version>/bin``."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda path: float(path.split("/")[4]))
    if not found:
        raise LocalServerError(INSTALL_HINT)
    return Path(found[-1]).parent


class LocalPostgres:
    """A PostgreSQL cluster whose whole state lives in a temporary directory; ``stop()`` removes it.

    >>> with LocalPostgres() as postgres:          # doctest: +SKIP
    ...     postgres.create_database("shop")
    ...     engine = sqlalchemy.create_engine(postgres.url("shop"))
    """

    def __init__(self, port: int | None = None) -> None:
        self.bin = postgres_bin()
        # Not below a test's tmp_path: the postgres user must be able to reach it.
        self.directory = Path(tempfile.mkdtemp(prefix="amqp-events-postgres-"))
        self.port = port or free_port()
        self.pid = 0
        self._as_postgres = os.geteuid() == 0

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def url(self, database: str = "postgres", driver: str = "postgresql+psycopg") -> str:
        """A SQLAlchemy URL of ``database`` (``driver="postgresql"`` for libpq and Django)."""
        return f"{driver}://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, timeout: float = 60.0) -> LocalPostgres:
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.directory, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
        options = (
            f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 "
            "-c max_connections=200 -c shared_buffers=128MB"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.directory / "log"), "-w",
            "-t", str(int(timeout)), "start",
        )  # fmt: skip
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        processes.write_down(self.pid)  # pg_ctl started it in a session of its own
        return self

    def create_database(self, name: str, owner: str | None = None) -> str:
        """Create database ``name`` (owned by a new role ``owner``, which logs in without a password); its URL."""
        server = ("-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres")
        if owner is None:
            self._run("createdb", *server, name)
            return self.url(name)
        self._run("createuser", *server, owner)
        self._run("createdb", *server, "-O", owner, name)
        return self.url(name).replace("postgres@", f"{owner}@", 1)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the cluster (SIGKILL after ``timeout``) and remove its directory."""
        if self.pid:
            with contextlib.suppress(LocalServerError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", str(int(timeout)), "stop")
            if not processes.wait_gone(self.pid, 10.0):
                processes.kill(self.pid)
            self.pid = 0
        shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = (self.directory / "log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, program: str, *args: str) -> None:
        argv = [str(self.bin / program), *args]
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.directory)
        if done.returncode != 0:
            raise LocalServerError(
                f"{program} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}\n{self.log_tail()}"
            )
