"""The liveness probe's answer says what it was judged on."""

from __future__ import annotations

import time

import pytest

from amqp_events.celery.health import Probes


@pytest.mark.parametrize("past_the_stall", [-0.01, 0.0, 0.0001, 0.0004, 0.01])
def test_a_loop_not_live_says_it_turned_longer_ago_than_the_stall(past_the_stall):
    probes = Probes(stall=2)
    probes.reconnecting = False
    probes.turned = time.monotonic() - 2 - past_the_stall
    live, said = probes.live()
    assert live == (said["loop_turned_seconds_ago"] <= said["stall"])
