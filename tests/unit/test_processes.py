"""Stopping exactly what was started: a PID is signalled only while it is still the process that was started."""

from __future__ import annotations

import subprocess

from amqp_events.local.processes import (
    STARTED,
    alive,
    group_members,
    same,
    start_session,
    start_ticks,
    sweep,
    terminate,
)


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


def test_a_sweep_stops_the_groups_written_down_and_leaves_the_others(tmp_path, monkeypatch):
    monkeypatch.setenv(STARTED, str(tmp_path))
    written = start_session(["sh", "-c", "sleep 30 & sleep 30"])  # a leader and a child in its group
    monkeypatch.delenv(STARTED)
    other = start_session(["sleep", "30"])
    try:
        assert [entry.name for entry in tmp_path.iterdir()] == [str(written.pid)]
        assert sweep(tmp_path, timeout=5) == [written.pid]
        assert written.wait(5) is not None
        assert group_members(written.pid) == []  # the child too
        assert alive(other.pid) and list(tmp_path.iterdir()) == []
    finally:
        terminate(other.pid, 5)
        other.wait(5)
