"""Fixtures of the broker tier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from contract_modes import BrokerMode, InProcessMode, Mode
from helpers import Records


@pytest.fixture(params=["in_process", "broker", "coroutines"])
def mode(request: pytest.FixtureRequest, records: Records, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mode]:
    if request.param == "in_process":
        monkeypatch.setenv("RECORD_FILE", str(records.path))
        in_memory = InProcessMode(monkeypatch)
        yield in_memory
        in_memory.stop()
    else:
        fixtures = [request.getfixturevalue(name) for name in ("worker", "producer")]
        coroutines = request.param == "coroutines"  # the same scenarios with the handlers written async def
        yield BrokerMode(*fixtures, records, request.getfixturevalue("service_app"), coroutines=coroutines)
