"""Ports and processes of the local servers: free ports to give them, and stopping exactly the PIDs started.

Each process is started in a session of its own (a Ctrl-C in the terminal is its starter's to handle), so a
starter killed before it stops what it started leaves it running. Where ``$AMQP_EVENTS_STARTED`` names a directory
(``scripts/test`` sets it), each start is written there, a file per PID holding its start time, and
:func:`sweep` stops what is left of them once the starter is gone, whatever stopped it."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from amqp_events.environment import variable
from amqp_events.errors import LocalServerError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing uses right now (see :func:`free_ports`)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing uses right now.

    They are chosen outside the kernel's ephemeral range: a port from that range
    can be handed to any process's outgoing connection between the moment it is
    chosen and the moment the node binds it, and the node would then fail to start.
    And free on every address (the wildcard), not only on 127.0.0.1: a cluster's nodes listen on addresses of
    their own (127.x.y.z), and a server bound to 0.0.0.0 needs the port free on all of them.
    """
    low, high = ephemeral_range()
    candidates = [port for port in range(10000, 65536) if not low <= port <= high]
    chosen: list[int] = []
    with contextlib.ExitStack() as held:  # held until all are chosen, so that none is chosen twice
        for port in random.sample(candidates, len(candidates)):
            sock = held.enter_context(socket.socket())
            try:
                sock.bind(("", port))
            except OSError:
                continue
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise LocalServerError(f"fewer than {count} free TCP ports outside the range {low}-{high}")


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Can a server bind ``port`` on ``host`` right now?"""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


#: The environment variable naming the directory where starts are written (see the module's text).
STARTED = "AMQP_EVENTS_STARTED"


def start_session(argv: Sequence[str], **options: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **options)`` in a session (and process group) of its own, written down where
    ``$AMQP_EVENTS_STARTED`` says, for :func:`sweep`."""
    process = subprocess.Popen(list(argv), start_new_session=True, **options)
    write_down(process.pid)
    return process


def write_down(pid: int) -> None:
    """Write down a process that leads a session of its own (one started here, or a server that went into the
    background by itself) where ``$AMQP_EVENTS_STARTED`` says, for :func:`sweep`."""
    ledger = variable(STARTED)
    if ledger:
        with contextlib.suppress(OSError):
            (Path(ledger) / str(pid)).write_text(str(start_ticks(pid)))


def sweep(ledger: Path, timeout: float = 10.0) -> list[int]:
    """Stop the process group of each start written in ``ledger`` whose processes still run (SIGTERM, SIGKILL
    after ``timeout``); returns the groups signalled. A group is signalled only while its leader is the process
    started (its start time matches) or gone: the kernel gives a group's number to no new process while any
    member of it is left."""
    groups = []
    for entry in sorted(ledger.glob("[0-9]*")):
        pid, started = int(entry.name), int(entry.read_text() or 0)
        # Zombies (a server whose starter ended, not reaped yet) run nothing: only a group with a live member counts.
        if (not alive(pid) or same(pid, started)) and group_members(pid) and _signal_group(pid, signal.SIGTERM):
            groups.append(pid)
        entry.unlink(missing_ok=True)
    if not groups_gone(groups, timeout):
        for pid in groups:
            _signal_group(pid, signal.SIGKILL)
        groups_gone(groups, 10.0)  # a signalled process ends a moment later
    return groups


def group_members(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that run (a zombie, ended and not yet reaped, does not)."""
    pids = (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return [pid for pid in pids if (fields := _stat(pid)) and fields[0] != "Z" and int(fields[2]) == pgid]


def groups_gone(groups: list[int], timeout: float) -> bool:
    """Wait up to ``timeout`` seconds until no process of ``groups`` runs; has none?"""
    deadline = time.monotonic() + timeout
    while any(group_members(pgid) for pgid in groups):
        if time.monotonic() > deadline:
            return False
        for pgid in groups:
            _reap(pgid)
        time.sleep(0.1)
    return True


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal process group ``pgid``; did it have a process?"""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def spawn(argv: Sequence[str], environment: Mapping[str, str], directory: Path, output: Path) -> int:
    """Start ``argv`` in the background in ``directory``, its output appended to ``output``; returns its PID."""
    with output.open("ab") as out:
        process = start_session(
            argv,
            env=dict(environment),
            cwd=directory,  # crash dumps land with the server, not where it was started
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return process.pid


def start_ticks(pid: int) -> int:
    """When process ``pid`` started (clock ticks since boot, field 22 of ``/proc/PID/stat``); 0 when none runs."""
    fields = _stat(pid)
    return int(fields[19]) if len(fields) > 19 else 0


def same(pid: int, started: int) -> int:
    """``pid`` while it is still the process that started at ``started`` (0: not known, trusted), else 0.

    PIDs come round again (32768 of them on many machines): a server that died on its own, reaped since, may have
    left its PID to any other process, which a stop must never signal.
    """
    if not started or start_ticks(pid) == started:
        return pid
    return 0


def alive(pid: int) -> bool:
    """Does process ``pid`` run (a zombie does not)?"""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command (which may hold spaces): the state first, field 3;
    ``[]`` when no process ``pid`` runs."""
    if pid <= 0:
        return []
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()
    except OSError:
        return []


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``pid`` to end (reaping it if it is our child); has it?"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            _reap(pid)
            return True
        _reap(pid)
        time.sleep(0.05)
    return not alive(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def terminate(pid: int, timeout: float, also: int = 0) -> None:
    """SIGTERM ``pid``; SIGKILL it (and ``also``) if it outlives ``timeout``."""
    if pid and alive(pid):
        os.kill(pid, signal.SIGTERM)
        if wait_gone(pid, timeout):
            return
    kill(pid, also)


def kill(*pids: int) -> None:
    """SIGKILL each of ``pids`` that runs, and wait until it is gone."""
    for pid in pids:
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        if pid:
            wait_gone(pid, 10.0)


def sweep_and_say(ledger: str) -> None:
    """:func:`sweep`, saying on stderr what it stopped (``scripts/test``, once its tests are over or stopped)."""
    swept = sweep(Path(ledger))
    if swept:
        print(f"stopped {len(swept)} process group(s) left by the tests: {swept}", file=sys.stderr)
