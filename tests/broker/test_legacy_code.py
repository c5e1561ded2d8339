"""Code written for 0.1.0 runs unchanged: a package in 0.1.0's shape (tests/services/legacy) on a real broker."""

from __future__ import annotations

import pytest

from amqp_events import Reason, events_app
from amqp_events.errors import DuplicateHandler


def test_a_0_1_0_package_runs_unchanged(start_worker, records, service_app, archive_of, monkeypatch, tmp_path):
    from helpers import TESTS, wait_archived

    env = {"RECORD_FILE": str(records.path), "PYTHONPATH": str(TESTS), "AMQP_EVENTS_MAX_RETRIES": "1",
           "AMQP_EVENTS_BACKOFF_MAX": "1"}  # fmt: skip
    start_worker("services.legacy.celery", env=env, cwd=TESTS)
    monkeypatch.setenv("AMQP_EVENTS_MAX_RETRIES", "1")
    service_app("legacy.celery")
    from services.legacy import events

    events.thing_happened("event")
    events.number_is_even(2)
    with pytest.raises(ValueError):
        events.number_is_even(3)
    events.thing_happened("retry")
    events.thing_happened("fail")
    archived = wait_archived(archive_of("legacy_consumer"), 2)  # "retry" asks again every time; "fail" fails
    assert sorted(entry.arguments[1]["value"] for entry in archived) == ["fail", "retry"]  # by name
    assert {(entry.reason, entry.attempts) for entry in archived} == {(Reason.MAX_RETRIES, 2)}  # 1 retry
    runs = records.wait(6)
    assert sorted(run["tag"] for run in runs) == ["even-2", "event", "fail", "fail", "retry", "retry"]


def test_a_second_handler_of_an_event_is_a_runtime_error_as_in_0_1_0():
    app = events_app("twice", broker_url="amqp://in-process.invalid//")

    @app.handler("a.b")
    def first(): ...

    with pytest.raises(RuntimeError, match="already has a handler"):

        @app.handler("a.b")
        def second(): ...

    assert issubclass(DuplicateHandler, RuntimeError)


def test_an_async_generator_handler_is_refused_where_it_is_written():
    app = events_app("asyncio", broker_url="amqp://in-process.invalid//")
    with pytest.raises(TypeError, match="is an async generator: a handler returns, it does not yield"):

        @app.handler("a.b")
        async def on_b():
            yield
