"""Every way Celery loads handler modules ends with the handler's queue consumed (real broker, real workers)."""

from __future__ import annotations

import pytest

from amqp_events.testing import wait_for


@pytest.mark.parametrize(
    ("app", "extra"),
    [
        ("services.loading.by_imports", ()),
        ("services.loading.by_include", ()),
        ("services.loading.by_cli", ("--include", "services.loading.cli_handlers")),
        ("services.loading.by_autodiscovery", ()),
    ],
    ids=["imports", "include", "--include", "autodiscover_tasks"],
)
def test_a_handler_is_consumed_however_its_module_is_loaded(app, extra, worker, producer, records):
    process = worker(app.removeprefix("services."), *extra)
    assert ".> loaded:loading.ping exchange=events(topic)" in process.log()  # Celery's own list of queues
    assert ".> celery " not in process.log()  # not Celery's default queue instead
    event_id = producer.fire("loading.ping", ["hello"], {})
    [record] = records.wait(1)
    assert record["id"] == event_id and record["service"] == "loaded"
    assert "consumes none of the service's event queues" not in process.log()


def test_a_worker_that_consumes_no_event_queue_says_so(worker):
    process = worker("loading.without_handlers")
    wait_for(lambda: "consumes none of the service's event queues" in process.log(), 10, what="the complaint")
    assert "ERROR" in process.log() and "celery worker --include" in process.log()
