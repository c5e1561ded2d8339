"""The demo runs to the end, and stops everything it started, also when interrupted."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT

from amqp_events.local.processes import start_session
from amqp_events.testing import wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]  # each run starts a node of its own

DEMO = ROOT / "examples" / "demo.py"


def descendants_of_the_demo(marker: str) -> list[int]:
    """PIDs of processes whose environment or command line mentions the demo's work directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def run_demo(*args: str) -> subprocess.Popen[str]:
    return start_session(
        [sys.executable, "-u", str(DEMO), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_the_demo_runs_to_a_summary(tmp_path):
    demo = run_demo("--events", "20")
    output, _ = demo.communicate(timeout=240)
    assert demo.returncode == 0, output
    assert "who handled what" in output and "shipping's archive" in output
    assert "no shipping address for customer 'nobody'" in output
    assert "\r" not in output  # not a terminal: plain lines, no line rewritten in place
    workdir = output.split("under ", 1)[1].split(")", 1)[0]
    assert not Path(workdir).exists() and descendants_of_the_demo(workdir) == []


def test_with_keep_the_closing_hint_can_be_followed_and_the_broker_stopped_as_it_says(tmp_path):
    demo = run_demo("--events", "10", "--keep")
    output, _ = demo.communicate(timeout=240)
    assert demo.returncode == 0, output
    assert "retries waiting on the broker: 0" in output  # once everything was handled, nothing waits
    workdir = output.split("under ", 1)[1].split(")", 1)[0]
    hinted = [line.strip() for line in output.splitlines() if " -A shipping archive " in line]
    stop = next(line.strip() for line in output.splitlines() if " broker stop --dir " in line)
    try:
        listed = subprocess.run(hinted[0], shell=True, capture_output=True, text=True, timeout=60)  # as printed
        assert listed.returncode == 0 and "no shipping address for customer 'nobody'" in listed.stdout, listed
        replayed = subprocess.run(hinted[-1] + " --yes", shell=True, capture_output=True, text=True, timeout=60)
        assert replayed.returncode == 0 and "replayed 1 message(s)" in replayed.stdout, replayed
    finally:
        stopped = subprocess.run(stop, shell=True, capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0 and "broker stopped" in stopped.stdout, stopped
    assert not Path(workdir).exists()
    wait_for(lambda: descendants_of_the_demo(workdir) == [], 30, what="the kept broker to end")


def test_ctrl_c_stops_everything_the_demo_started():
    demo = run_demo("--events", "100000")
    lines: list[str] = []
    wait_for(lambda: lines.append(demo.stdout.readline()) or "workers ready" in lines[-1], 120, interval=0)
    workdir = "".join(lines).split("under ", 1)[1].split(")", 1)[0]
    assert descendants_of_the_demo(workdir)  # the node and the workers run
    time.sleep(1)  # not a wait for an outcome: the Ctrl-C comes while events flow, as a user's would
    os.killpg(demo.pid, signal.SIGINT)
    try:
        output, _ = demo.communicate(timeout=120)
    except subprocess.TimeoutExpired as exc:
        for pid in [demo.pid, *descendants_of_the_demo(workdir)]:  # only what this demo started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        demo.communicate()
        output = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else str(exc.output)
        pytest.fail(f"the demo did not stop within 120 s of Ctrl-C; its output ended with:\n{output[-2000:]}")
    assert demo.returncode == 130 and "interrupted" in output
    wait_for(lambda: descendants_of_the_demo(workdir) == [], 30, what="every process of the demo to end")
