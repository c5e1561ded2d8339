"""A private, throwaway RabbitMQ node in a local directory (development and tests only).

The demo, the test harness and ``amqp-events broker start|stop|status`` all
use this one class. The node never touches a system RabbitMQ: it gets its own
node name, AMQP/distribution/epmd/management ports, data and log directories
and Erlang cookie, all under ``directory``. Everything it starts is recorded
by PID in ``directory/state.json`` so that ``stop`` ends exactly those
processes, also from another process.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path

from amqp_events.errors import LocalServerError
from amqp_events.management import ManagementAPI

RABBITMQ_SBIN = Path("/usr/lib/rabbitmq/bin")
INSTALL_HINT = (
    "RabbitMQ is not installed: install Debian's package with "
    "`sudo apt-get update && sudo apt-get install -y rabbitmq-server` "
    "(the system service does not need to run)"
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing uses right now (see :func:`free_ports`)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing uses right now.

    They are chosen outside the kernel's ephemeral range: a port from that range
    can be handed to any process's outgoing connection between the moment it is
    chosen and the moment the node binds it, and the node would then fail to start.
    """
    low, high = ephemeral_range()
    candidates = [port for port in range(10000, 65536) if not low <= port <= high]
    chosen: list[int] = []
    with contextlib.ExitStack() as held:  # held until all are chosen, so that none is chosen twice
        for port in random.sample(candidates, len(candidates)):
            sock = held.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise LocalServerError(f"fewer than {count} free TCP ports outside the range {low}-{high}")


def port_is_free(port: int) -> bool:
    """Can a server bind ``port`` on 127.0.0.1 right now?"""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


@dataclass
class NodeState:
    """What a running node is made of; saved as ``state.json``."""

    nodename: str
    amqp_port: int
    dist_port: int
    epmd_port: int
    management_port: int
    prometheus_port: int
    server_pid: int = 0
    epmd_pid: int = 0
    #: HOME of the node: where its Erlang cookie is (shared by the nodes of a cluster).
    home: str = ""


class LocalBroker:
    """A RabbitMQ node whose whole state lives in ``directory``.

    >>> broker = LocalBroker(Path(".amqp-events/broker"))
    >>> broker.start()           # doctest: +SKIP
    >>> broker.url               # doctest: +SKIP
    'amqp://guest:guest@127.0.0.1:40123/'
    >>> broker.stop()            # doctest: +SKIP
    """

    def __init__(
        self,
        directory: Path | str,
        port: int | None = None,
        config: dict[str, str] | None = None,
        *,
        epmd_port: int | None = None,
        home: Path | None = None,
    ) -> None:
        self.directory = Path(directory).absolute()
        self.requested_port = port
        #: Extra ``rabbitmq.conf`` settings, e.g. ``{"max_message_size": "4194304"}``.
        self.config = dict(config or {})
        #: A cluster's: its epmd (which the cluster runs, not the node) and its nodes' common HOME.
        self.shared_epmd_port, self.shared_home = epmd_port, home
        self.state: NodeState | None = self._load_state()

    # -- public API -------------------------------------------------------

    @property
    def url(self) -> str:
        """The AMQP URL of the node's default vhost."""
        return self.vhost_url("/")

    def vhost_url(self, vhost: str) -> str:
        state = self._require_state()
        path = "" if vhost == "/" else urllib.parse.quote(vhost, safe="")
        return f"amqp://guest:guest@127.0.0.1:{state.amqp_port}/{path}"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self._require_state().management_port}"

    def is_running(self) -> bool:
        return self.state is not None and _alive(self.state.server_pid)

    def start(self, timeout: float = 90.0) -> None:
        """Start the node (keeping data from an earlier run) and wait until it accepts AMQP connections."""
        if self.is_running():
            return
        server = RABBITMQ_SBIN / "rabbitmq-server"
        if not server.exists() or shutil.which("epmd") is None:
            raise LocalServerError(INSTALL_HINT)
        state = self.state or self._new_state()
        for path in (self.directory / "mnesia", self.directory / "log", Path(state.home)):
            path.mkdir(parents=True, exist_ok=True)
        self._write_config(state)
        if self.shared_epmd_port is None and not _alive(state.epmd_pid):  # after kill() the node's epmd is still up
            state.epmd_pid = self._spawn(["epmd", "-port", str(state.epmd_port)], state, self.directory / "epmd.out")
        state.server_pid = self._spawn([str(server)], state, self.directory / "server.out")
        self.state = state
        self._save_state()
        try:
            self._wait_until_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the node gracefully (SIGKILL after ``timeout``) and the epmd it started."""
        state = self.state
        if state is None:
            return
        _terminate(state.server_pid, timeout, also=self.beam_pid())
        _terminate(state.epmd_pid, 10.0)
        state.server_pid = state.epmd_pid = 0
        self._save_state()

    def kill(self) -> None:
        """Crash the node: SIGKILL the Erlang VM, as a power cut would. ``start()`` brings it back."""
        state = self._require_state()
        beam = self.beam_pid()
        for pid in (beam, state.server_pid):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        for pid in (beam, state.server_pid):
            if pid:
                _wait_gone(pid, 10.0)
        state.server_pid = 0
        self._save_state()

    @property
    def management(self) -> ManagementAPI:
        """The node's management HTTP API (as guest)."""
        return ManagementAPI(self.management_url)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the node's own log, for error reports."""
        logs = sorted((self.directory / "log").glob("*.log"))
        text = "".join(path.read_text(errors="replace") for path in logs)
        return "\n".join(text.splitlines()[-lines:])

    # -- internals --------------------------------------------------------

    def rabbitmqctl(self, *args: str, timeout: float = 60.0, program: str = "rabbitmqctl") -> str:
        """Run ``rabbitmqctl`` (or ``rabbitmq-queues``, ...) against this node; returns its output."""
        state = self._require_state()
        done = subprocess.run(
            [str(RABBITMQ_SBIN / program), "-n", state.nodename, *args],
            env=self._environment(state),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise LocalServerError(f"{program} {' '.join(args)} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def _new_state(self) -> NodeState:
        amqp_port, dist_port, epmd_port, management_port, prometheus_port = free_ports(5)
        amqp_port = self.requested_port or amqp_port
        return NodeState(
            nodename=f"amqp-events-{amqp_port}@localhost",
            amqp_port=amqp_port,
            dist_port=dist_port,
            epmd_port=self.shared_epmd_port or epmd_port,
            management_port=management_port,
            prometheus_port=prometheus_port,
            home=str(self.shared_home or self.directory / "home"),
        )

    def _environment(self, state: NodeState) -> dict[str, str]:
        base = self.directory
        return {
            **os.environ,
            "HOME": state.home or str(base / "home"),
            "RABBITMQ_NODENAME": state.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(state.amqp_port),
            "RABBITMQ_DIST_PORT": str(state.dist_port),
            "ERL_EPMD_PORT": str(state.epmd_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        }

    def _write_config(self, state: NodeState) -> None:
        base = self.directory
        (base / "rabbitmq.conf").write_text(
            "\n".join(
                [
                    f"listeners.tcp.default = 127.0.0.1:{state.amqp_port}",
                    f"management.tcp.port = {state.management_port}",
                    "management.tcp.ip = 127.0.0.1",
                    f"prometheus.tcp.port = {state.prometheus_port}",
                    "prometheus.tcp.ip = 127.0.0.1",
                    "log.file.level = info",
                    "log.console = false",
                    *(f"{key} = {value}" for key, value in self.config.items()),
                    "",
                ]
            )
        )
        (base / "advanced.config").write_text("[].\n")
        (base / "rabbitmq-env.conf").write_text("")
        (base / "enabled_plugins").write_text("[rabbitmq_management,rabbitmq_prometheus].\n")

    def _spawn(self, argv: list[str], state: NodeState, output: Path) -> int:
        with output.open("ab") as out:
            process = subprocess.Popen(
                argv,
                env=self._environment(state),
                cwd=self.directory,  # crash and Mnesia core dumps land with the node, not where it was started
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not the node's
            )
        return process.pid

    def _wait_until_ready(self, timeout: float) -> None:
        import amqp

        state = self._require_state()
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if not _alive(state.server_pid):
                raise LocalServerError(f"RabbitMQ exited during start-up; its log says:\n{self.log_tail()}")
            try:
                connection = amqp.Connection(f"127.0.0.1:{state.amqp_port}", connect_timeout=2)
                connection.connect()
                connection.close()
                return
            except Exception as exc:  # not listening yet
                last_error = exc
                time.sleep(0.25)
        raise LocalServerError(
            f"RabbitMQ did not accept connections within {timeout:.0f}s ({last_error}); "
            f"its log says:\n{self.log_tail()}"
        )

    def beam_pid(self) -> int:
        """PID of the node's Erlang VM (started by ``rabbitmq-server``), 0 when unknown."""
        try:
            return int((self.directory / "rabbitmq.pid").read_text().strip())
        except (OSError, ValueError):
            return 0

    def _require_state(self) -> NodeState:
        if self.state is None:
            raise LocalServerError(f"no node has been started in {self.directory}")
        return self.state

    def _load_state(self) -> NodeState | None:
        try:
            return NodeState(**json.loads((self.directory / "state.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def _save_state(self) -> None:
        assert self.state is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "state.json").write_text(json.dumps(asdict(self.state), indent=2))


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            _reap(pid)
            return True
        _reap(pid)
        time.sleep(0.05)
    return not _alive(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _terminate(pid: int, timeout: float, also: int = 0) -> None:
    """SIGTERM ``pid``; SIGKILL it (and ``also``) if it outlives ``timeout``."""
    if pid and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        if _wait_gone(pid, timeout):
            return
    for victim in (pid, also):
        if victim and _alive(victim):
            os.kill(victim, signal.SIGKILL)
            _wait_gone(victim, 10.0)
