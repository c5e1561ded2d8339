"""Fixtures of the broker tier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from contract_modes import BrokerMode, InProcessMode, Mode
from helpers import Records


@pytest.fixture(params=["in_process", "broker", "in_process_async", "broker_async", "broker_typed"])
def mode(request: pytest.FixtureRequest, records: Records, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mode]:
    """Each scenario in both modes, with the test services' handlers written plain and ``async def``; and on the
    broker with workers started as typed (``celery worker -c 2``: the consuming pool)."""
    coroutines = request.param.endswith("_async")
    if request.param.startswith("in_process"):
        monkeypatch.setenv("RECORD_FILE", str(records.path))
        in_memory = InProcessMode(monkeypatch, coroutines=coroutines)
        yield in_memory
        in_memory.stop()
    else:
        fixtures = [request.getfixturevalue(name) for name in ("worker", "producer")]
        service_app = request.getfixturevalue("service_app")
        typed = request.param == "broker_typed"
        yield BrokerMode(*fixtures, records, service_app, monkeypatch, coroutines=coroutines, typed=typed)
