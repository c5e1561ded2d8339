"""A private, throwaway RabbitMQ node in a local directory (development and tests only).

The demo, the test harness and ``amqp-events broker start|stop|status`` all
use this one class. The node never touches a system RabbitMQ: it gets its own
node name, AMQP/distribution/epmd/management ports, data and log directories
and Erlang cookie, all under ``directory``. Everything it starts is recorded
by PID in ``directory/state.json`` so that ``stop`` ends exactly those
processes, also from another process. It runs the machine's RabbitMQ or
another line installed in a Debian root (:mod:`~amqp_events.local.installation`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path

from amqp_events.errors import LocalServerError
from amqp_events.local import processes
from amqp_events.local.installation import Installation, find
from amqp_events.transport.management import ManagementAPI

LOOPBACK = "127.0.0.1"
#: Starts of a node whose distribution port another process took in the meantime, before it gives up.
PORT_ATTEMPTS = 3
#: The plugins a local node runs: the management API and Prometheus endpoint (both ship with RabbitMQ).
PLUGINS = ("rabbitmq_management", "rabbitmq_prometheus")
#: How soon a node of its own resends a dead-lettered message its target queue did not confirm (RabbitMQ: 180 s).
DEAD_LETTER_RESEND_MS = 10_000


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
    #: When each started (see :func:`~amqp_events.local.processes.same`): 0 in a state saved before they were kept.
    server_started: int = 0
    epmd_started: int = 0
    #: HOME of the node: where its Erlang cookie is (shared by the nodes of a cluster).
    home: str = ""
    #: The loopback address the node listens on (its own, in a cluster: see :mod:`~amqp_events.local.partition`).
    host: str = LOOPBACK
    #: The root of the RabbitMQ installation it runs (``/``: the machine's own).
    rabbitmq_root: str = "/"


class LocalBroker:
    """A RabbitMQ node whose whole state lives in ``directory``.

    >>> broker = LocalBroker(Path(".amqp-events/broker"))
    >>> broker.start()           # doctest: +SKIP
    >>> broker.url               # doctest: +SKIP
    'amqp://guest:guest@127.0.0.1:40123/'
    >>> broker.stop()            # doctest: +SKIP

    ``rabbitmq`` picks the installation (default: :func:`~amqp_events.local.installation.find`),
    ``host`` a loopback address of the node's own (``127.x.y.z``: a node name with that address,
    distribution traffic from and to it only).
    """

    def __init__(
        self,
        directory: Path | str,
        port: int | None = None,
        config: dict[str, str] | None = None,
        *,
        epmd_port: int | None = None,
        home: Path | None = None,
        rabbitmq: Installation | None = None,
        host: str = LOOPBACK,
    ) -> None:
        self.directory = Path(directory).absolute()
        self.requested_port = port
        #: Extra ``rabbitmq.conf`` settings, e.g. ``{"max_message_size": "4194304"}``.
        self.config = dict(config or {})
        #: A cluster's: its epmd (which the cluster runs, not the node) and its nodes' common HOME.
        self.shared_epmd_port, self.shared_home = epmd_port, home
        self.requested_rabbitmq, self.requested_host = rabbitmq, host
        self.state: NodeState | None = self._load_state()

    # -- public API -------------------------------------------------------

    @property
    def url(self) -> str:
        """The AMQP URL of the node's default vhost."""
        return self.vhost_url("/")

    def vhost_url(self, vhost: str) -> str:
        state = self._require_state()
        path = "" if vhost == "/" else urllib.parse.quote(vhost, safe="")
        return f"amqp://guest:guest@{state.host}:{state.amqp_port}/{path}"

    @property
    def management_url(self) -> str:
        state = self._require_state()
        return f"http://{state.host}:{state.management_port}"

    @property
    def rabbitmq(self) -> Installation:
        """The RabbitMQ installation the node runs (chosen when it is first started)."""
        if self.state is not None:
            return Installation(Path(self.state.rabbitmq_root))
        return self.requested_rabbitmq or find()

    def is_running(self) -> bool:
        return self.state is not None and processes.alive(self.server_pid())

    def start(self, timeout: float = 90.0) -> None:
        """Start the node (keeping data from an earlier run) and wait until it accepts AMQP connections."""
        if self.is_running():
            return
        state = self.state or self._new_state()
        Installation(Path(state.rabbitmq_root)).check()
        for path in (self.directory / "mnesia", self.directory / "log", Path(state.home)):
            path.mkdir(parents=True, exist_ok=True)
        if self.shared_epmd_port is None and not processes.alive(processes.same(state.epmd_pid, state.epmd_started)):
            state.epmd_pid = self._spawn("epmd", ["-port", str(state.epmd_port)], state, "epmd.out")  # kill() keeps it
            state.epmd_started = processes.start_ticks(state.epmd_pid)
        output = self.directory / "server.out"
        for attempt in range(PORT_ATTEMPTS):
            written = output.stat().st_size if output.exists() else 0
            self._write_config(state)
            state.server_pid = self._spawn("rabbitmq-server", [], state, "server.out")
            state.server_started = processes.start_ticks(state.server_pid)
            self.state = state
            self._save_state()
            try:
                self._wait_until_ready(timeout)
                return
            except LocalServerError:
                if attempt + 1 == PORT_ATTEMPTS or not self._port_taken(written):
                    self.stop()
                    raise
                # Another process bound one of the node's ports between their choice and the node's start: the
                # node keeps its name (a cluster knows it by name) and the ports in use are chosen again.
                self._choose_again_ports_in_use(state)
            except BaseException:
                self.stop()
                raise

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the node gracefully (SIGKILL after ``timeout``) and the epmd it started."""
        state = self.state
        if state is None:
            return
        processes.terminate(self.server_pid(), timeout, also=self.beam_pid())
        processes.terminate(processes.same(state.epmd_pid, state.epmd_started), 10.0)
        state.server_pid = state.epmd_pid = 0
        self._save_state()

    def kill(self) -> None:
        """Crash the node: SIGKILL the Erlang VM, as a power cut would. ``start()`` brings it back."""
        state = self._require_state()
        processes.kill(self.beam_pid(), self.server_pid())
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

    def rabbitmqctl(self, *args: str, timeout: float = 60.0, program: str = "rabbitmqctl") -> str:
        """Run ``rabbitmqctl`` (or ``rabbitmq-queues``, ...) against this node; returns its output."""
        state = self._require_state()
        argv, environment = self._command(program, ["-n", state.nodename, *args], state)
        done = subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:  # its reason often comes on the lines after "Error:": one line, all of it
            said = " ".join((done.stderr.strip() or done.stdout).split())
            raise LocalServerError(f"{program} {' '.join(args)} failed: {said}")
        return done.stdout

    def beam_pid(self) -> int:
        """PID of the node's Erlang VM (started by ``rabbitmq-server``), 0 when unknown (or when the file names a
        process that is not an Erlang VM any more)."""
        try:
            pid = int((self.directory / "rabbitmq.pid").read_text().strip())
            return pid if b"beam" in Path(f"/proc/{pid}/cmdline").read_bytes() else 0
        except (OSError, ValueError):
            return 0

    def server_pid(self) -> int:
        """PID of the node's ``rabbitmq-server`` while it is the process this node started, else 0."""
        state = self.state
        return processes.same(state.server_pid, state.server_started) if state is not None else 0

    # -- internals --------------------------------------------------------

    def _port_taken(self, since: int) -> bool:
        """Did the node stop at start-up because one of its ports was in use (what it wrote after the first
        ``since`` bytes of its output says so)?"""
        with (self.directory / "server.out").open("rb") as output:
            output.seek(since)
            written = output.read()
        return b"dist_port_already_used" in written or b"eaddrinuse" in written

    def _choose_again_ports_in_use(self, state: NodeState) -> None:
        fields = ["dist_port", "management_port", "prometheus_port"]
        if self.requested_port is None:
            fields.append("amqp_port")
        # Free on every address: a listener the node binds to the wildcard conflicts with any of them.
        in_use = [field for field in fields if not processes.port_is_free(getattr(state, field), host="")]
        if in_use:  # else the port was given back meanwhile: the same ones are tried again
            for field, port in zip(in_use, processes.free_ports(len(in_use)), strict=True):
                setattr(state, field, port)

    def _new_state(self) -> NodeState:
        amqp_port, dist_port, epmd_port, management_port, prometheus_port = processes.free_ports(5)
        amqp_port = self.requested_port or amqp_port
        host = self.requested_host
        return NodeState(
            nodename=f"amqp-events-{amqp_port}@{'localhost' if host == LOOPBACK else host}",
            amqp_port=amqp_port,
            dist_port=dist_port,
            epmd_port=self.shared_epmd_port or epmd_port,
            management_port=management_port,
            prometheus_port=prometheus_port,
            home=str(self.shared_home or self.directory / "home"),
            host=host,
            rabbitmq_root=str((self.requested_rabbitmq or find()).root),
        )

    def _command(self, program: str, args: list[str], state: NodeState) -> tuple[list[str], dict[str, str]]:
        """``program`` of the node's installation, in the node's environment."""
        base = self.directory
        environment = {
            **os.environ,
            "HOME": state.home,
            "RABBITMQ_NODENAME": state.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": state.host,
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
        if state.host != LOOPBACK:  # a node name with an address is a long name
            environment["RABBITMQ_USE_LONGNAME"] = "true"
        else:  # a node for this machine alone: its epmd listens on loopback only (not 0.0.0.0)
            environment["ERL_EPMD_ADDRESS"] = LOOPBACK
        return Installation(Path(state.rabbitmq_root)).command(program, args, environment, self._shown(state))

    def _shown(self, state: NodeState) -> list[Path]:
        """The directories a node in a root sees: its own, and its HOME."""
        base = self.directory
        return [base] if Path(state.home).is_relative_to(base) else [base, Path(state.home)]

    def _seen_as(self, value: str, state: NodeState) -> str:
        """A setting's value as the node sees it (a path into its directory, inside a root)."""
        return Installation(Path(state.rabbitmq_root)).seen_as(value, self._shown(state))

    def _write_config(self, state: NodeState) -> None:
        base = self.directory
        (base / "rabbitmq.conf").write_text(
            "\n".join(
                [
                    f"listeners.tcp.default = {state.host}:{state.amqp_port}",
                    f"management.tcp.port = {state.management_port}",
                    f"management.tcp.ip = {state.host}",
                    f"prometheus.tcp.port = {state.prometheus_port}",
                    f"prometheus.tcp.ip = {state.host}",
                    "log.file.level = info",
                    "log.console = false",
                    *(f"{key} = {self._seen_as(value, state)}" for key, value in self.config.items()),
                    "",
                ]
            )
        )
        # Erlang distribution listens on the node's address alone (loopback for a node of this machine), never 0.0.0.0.
        address = "{" + state.host.replace(".", ",") + "}"
        settings = f"{{inet_dist_use_interface, {address}}}"
        if state.host != LOOPBACK:  # and connects from it
            settings += f", {{inet_dist_connect_options, [{{ip, {address}}}]}}"
        kernel = f"{{kernel, [{settings}]}}"
        # A retry that expired on the delay ladder while its next queue was not back yet (a restart) is dead-lettered
        # again after this many ms, not RabbitMQ's 3 minutes: a node for development and tests, where a restart
        # is a moment and a duplicate from a resend too early is harmless.
        rabbit = f"{{rabbit, [{{dead_letter_worker_publisher_confirm_timeout, {DEAD_LETTER_RESEND_MS}}}]}}"
        (base / "advanced.config").write_text(f"[{rabbit}, {kernel}].\n")
        (base / "rabbitmq-env.conf").write_text("")
        (base / "enabled_plugins").write_text(f"[{','.join(PLUGINS)}].\n")

    def _spawn(self, program: str, args: list[str], state: NodeState, output: str) -> int:
        argv, environment = self._command(program, args, state)
        return processes.spawn(argv, environment, self.directory, self.directory / output)

    def _wait_until_ready(self, timeout: float) -> None:
        import amqp

        state = self._require_state()
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if not processes.alive(self.server_pid()):
                raise LocalServerError(f"RabbitMQ exited during start-up; its log says:\n{self.log_tail()}")
            try:
                connection = amqp.Connection(f"{state.host}:{state.amqp_port}", connect_timeout=2)
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
