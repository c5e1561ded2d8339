"""The fault-injection suite at CI size: workers killed, the broker crashed, bad input; nothing lost."""

from __future__ import annotations

import pytest

from faults.scenario import run

pytestmark = pytest.mark.broker


@pytest.mark.timeout(900)
def test_nothing_is_lost_under_worker_kills_a_broker_crash_and_bad_input(tmp_path, rabbitmq):
    if rabbitmq.node is None:
        pytest.skip("needs nodes of its own, which it starts (not $AMQP_URL)")
    report = run(events=1500, workdir=tmp_path, duration=45, deadline=240)
    print("\n| | |\n|---|---|\n" + report.table())
    assert report.confirmed == 1500 and report.broker_restarts == 1 and report.worker_kills >= 5
    assert report.fire_errors > 0  # the broker was down longer than the publish timeout: firing raised, then retried
    assert report.lost == []
    assert report.archive_missing == [] and report.archive_unexpected == []
    assert report.leftover == {}
    assert report.archived["undecodable"] >= 9 and report.archived["forbidden_content_type"] >= 3
    assert report.refused_bad_inputs == 1  # above the broker's max message size: refused at publish time
