"""``bash scripts/test`` stopped while its tests run (Ctrl-C, or SIGTERM to its process group) leaves nothing of
what they started running: the RabbitMQ node, its epmd and the workers, each in a session of its own, are written
down as they start and stopped by PID when the script ends."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from helpers import ROOT

from amqp_events.local.processes import STARTED, alive, group_members, same, start_session, sweep
from amqp_events.testing import wait_for


def as_typed() -> None:
    """Start the script as a terminal does a command typed at its prompt: SIGINT at its default. A suite itself run
    in the background (``bash scripts/test &``) ignores SIGINT, and what it starts would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


#: The harness's own bounds on what an interrupted run stops, one after another: the worker (a warm shutdown, 20 s,
#: then SIGKILL), the node (60 s, then SIGKILL) and its epmd (10 s), then the script's sweep of what is left (10 s,
#: then SIGKILL); with room for a machine the rest of the suite loads.
STOPPED_WITHIN = 240


def groups_left(started: dict[int, int]) -> list[int]:
    """The groups of ``started`` (PID: start time) of which a process still runs."""
    # A number given to another process since is not ours.
    return [pid for pid, ticks in started.items() if group_members(pid) and (not alive(pid) or same(pid, ticks))]


@pytest.mark.parametrize("interrupt", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_stopping_the_test_command_leaves_no_process_it_started(tmp_path, interrupt):
    ledger, ready = tmp_path / "started", tmp_path / "ready"
    ledger.mkdir()
    # Set up already (this suite runs): a setup would reinstall the package under the tests running beside this one.
    env = {**os.environ, STARTED: str(ledger), "AMQP_EVENTS_PROBE_READY": str(ready), "AMQP_EVENTS_SET_UP": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    command = ["bash", "scripts/test", "tests/broker/interrupted_run.py", "-n", "0", "-p", "no:cacheprovider"]
    script = start_session(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=as_typed
    )
    try:
        wait_for(lambda: ready.exists() or script.poll() is not None, timeout=240, what="the probe's worker")
        assert script.poll() is None, script.communicate()[0]
        started = {int(entry.name): int(entry.read_text()) for entry in ledger.iterdir()}
        assert len(started) >= 4, started  # the node, its epmd, the worker, PostgreSQL (in the background)
        os.killpg(script.pid, interrupt)  # as a terminal's Ctrl-C, or a supervisor's stop, reaches the group
        try:
            output, _ = script.communicate(timeout=STOPPED_WITHIN)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"still running {STOPPED_WITHIN} s after the interrupt: {groups_left(started)}\n{exc.output}")
        assert script.returncode != 0, output
        assert groups_left(started) == [], output
        assert list(ledger.iterdir()) == []
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait(10)
        sweep(ledger)  # what a failed run left (the node and the worker run in sessions of their own)
