"""Stopping exactly what was started: a PID is signalled only while it is still the process that was started."""

from __future__ import annotations

import subprocess

from amqp_events.local.processes import alive, same, start_ticks, terminate


def test_a_pid_is_the_process_started_only_while_its_start_time_matches():
    process = subprocess.Popen(["sleep", "30"])
    try:
        started = start_ticks(process.pid)
        assert started > 0
        assert same(process.pid, started) == process.pid
        assert same(process.pid, 0) == process.pid  # a state saved before start times were kept: trusted
        assert same(process.pid, started + 1) == 0  # another process that got the number: never signalled
        terminate(same(process.pid, started + 1), 5)
        assert alive(process.pid)
    finally:
        terminate(process.pid, 5)
    assert process.wait(5) is not None
    assert start_ticks(process.pid) == 0 and same(process.pid, started) == 0
