"""The fault-injection suite at CI size: workers killed, the broker crashed, bad input; nothing lost.

Each run fires over 20 s: enough for the broker crash (at 40%, down 6 s) and the bad input (at 70%); the faults go
on after the last event until the kills and node faults a test asserts have happened (``faults.scenario.run``).
Sized to what they prove: at 25-30 events a second, every kill and the crash find events in flight, queued and
waiting on the delay ladder; more events cost the machine more and prove no more (``python -m faults`` runs larger)."""

from __future__ import annotations

from typing import Any

import pytest

from faults.scenario import Report, run


def fault_run(rabbitmq: Any, **options: Any) -> Report:
    """One run of the suite on nodes of its own, its report printed."""
    if rabbitmq.node is None:
        pytest.skip("needs nodes of its own, which it starts (not $AMQP_URL)")
    report = run(**options)
    print("\n| | |\n|---|---|\n" + report.table())
    return report


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_nothing_is_lost_under_worker_kills_a_broker_crash_and_bad_input(tmp_path, rabbitmq):
    report = fault_run(rabbitmq, events=600, workdir=tmp_path, duration=20, deadline=240)
    assert report.confirmed == 600 and report.broker_restarts == 1 and report.worker_kills >= 5
    assert report.fire_errors > 0  # the broker was down longer than the publish timeout: firing raised, then retried
    assert report.lost == []
    assert report.archive_missing == [] and report.archive_unexpected == []
    assert report.leftover == {}
    assert report.archived["undecodable"] >= 9 and report.archived["forbidden_content_type"] >= 3
    assert report.refused_bad_inputs == 1  # above the broker's max message size: refused at publish time


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_through_the_outbox_committed_events_all_arrive_and_rolled_back_ones_never(tmp_path, rabbitmq):
    report = fault_run(rabbitmq, events=500, workdir=tmp_path, duration=20, deadline=240, outbox=True)
    assert report.confirmed == 450 and report.rolled_back == 50 and report.phantoms == []
    assert report.fire_errors == 0  # writing to the outbox never waits for the broker
    assert report.broker_restarts == 1 and report.worker_kills + report.relay_kills >= 5
    assert report.lost == [] and report.outbox_left == 0 and report.leftover == {}
    assert report.archive_missing == [] and report.archive_unexpected == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_through_the_inbox_every_effect_happens_exactly_once(tmp_path, rabbitmq):
    report = fault_run(rabbitmq, events=500, workdir=tmp_path, duration=20, deadline=240, inbox=True)
    assert report.broker_restarts == 1 and report.worker_kills >= 5
    assert report.lost == [] and report.duplicate_effects == 0 and report.leftover == {}
    assert report.archive_missing == [] and report.archive_unexpected == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_on_a_cluster_whose_nodes_die_in_turn_nothing_is_lost(tmp_path, rabbitmq):
    report = fault_run(rabbitmq, events=500, workdir=tmp_path, duration=20, deadline=240, cluster=3)
    assert report.confirmed == 500 and report.node_faults >= 2 and report.worker_kills >= 5
    assert report.lost == [] and report.leftover == {}
    assert report.archive_missing == [] and report.archive_unexpected == []
