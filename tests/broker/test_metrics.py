"""Prometheus metrics from producers, workers (prefork too) and the exporter, on a real broker."""

from __future__ import annotations

import pytest
from helpers import scrape, value, wait_archived

from amqp_events.celery import events_app
from amqp_events.exporter import Exporter
from amqp_events.local.processes import free_port
from amqp_events.testing import wait_for

#: The consuming pool chosen by name, as its module's text says (-P custom).
CONSUMING = {"CELERY_CUSTOM_WORKER_POOL": "amqp_events.celery.pool:ConsumingPool"}


@pytest.mark.parametrize(("pool", "concurrency"), [("solo", 1), ("prefork", 2), ("custom", 2)])
def test_worker_metrics_count_outcomes_failures_durations_and_archives(
    pool, concurrency, worker, producer, records, archive_of
):
    port = free_port()
    env = {"AMQP_EVENTS_METRICS_PORT": str(port), **(CONSUMING if pool == "custom" else {})}
    worker("orders", pool=pool, concurrency=concurrency, env=env)
    for n in range(4):
        producer.fire("test.ping", [f"ok{n}"], {})
    producer.fire("test.ping", ["flaky"], {"how": {"fail_times": 1}})
    producer.fire("test.ping", ["doomed"], {"how": {"permanent": True}})
    wait_archived(archive_of("orders"), 1)
    records.wait(7)
    handler = {"service": "orders", "handler": "services.orders.on_ping"}

    def settled() -> dict[str, float]:
        metrics = scrape(port)
        return metrics if value(metrics, "amqp_events_handler_outcomes_total", **handler) >= 7 else {}

    metrics = wait_for(settled, 20, what="all seven handler runs in the metrics")
    assert value(metrics, "amqp_events_handler_outcomes_total", outcome="success", **handler) == 5
    assert value(metrics, "amqp_events_handler_outcomes_total", outcome="retry_scheduled", **handler) == 1
    assert value(metrics, "amqp_events_handler_outcomes_total", outcome="archived", **handler) == 1
    failures = "amqp_events_handler_failures_total"
    assert value(metrics, failures, exception="Flaky", disposition="retry", **handler) == 1
    assert value(metrics, failures, exception="PermanentFailure", disposition="archive", **handler) == 1
    assert value(metrics, "amqp_events_handler_duration_seconds_count", outcome="success", **handler) == 5
    assert value(metrics, "amqp_events_handler_duration_seconds_count", outcome="archived", **handler) == 1
    assert value(metrics, "amqp_events_handler_attempts_sum", outcome="success", **handler) == 4 + 2
    assert value(metrics, "amqp_events_queue_wait_seconds_count", **handler) == 7
    assert value(metrics, "amqp_events_archived_total", service="orders", reason="non_retryable") == 1
    assert value(metrics, "amqp_events_handlers_in_progress", **handler) == 0
    assert not any("pid=" in key or "hostname=" in key for key in metrics)


def test_producer_metrics_count_confirmed_and_unroutable(worker, broker_url):
    from prometheus_client import REGISTRY

    # A producer of its own: the counters are the process's, and another test's threads here may fire as "tests".
    producer = events_app("metered", broker_url=broker_url)

    def fired(result: str, event: str) -> float:
        labels = {"service": "metered", "event": event, "result": result}
        return REGISTRY.get_sample_value("amqp_events_events_fired_total", labels) or 0.0

    worker("orders")
    try:
        before = fired("confirmed", "test.ping"), fired("unroutable", "nobody.listens")
        producer.fire("test.ping", ["x"], {})
        producer.fire("nobody.listens", [], {})
        with producer.batch():
            producer.fire("test.ping", ["y"], {})
    finally:
        producer.close()
    assert fired("confirmed", "test.ping") == before[0] + 2
    assert fired("unroutable", "nobody.listens") == before[1] + 1


def test_the_exporter_reports_queues_and_workers_and_notices_a_killed_one(
    worker, producer, archive_of, rabbitmq, service_app
):
    process = worker("orders", env={"HEARTBEAT_INTERVAL": "0.5"})
    producer.fire("test.ping", ["doomed"], {"how": {"permanent": True}})
    wait_archived(archive_of("orders"), 1)
    port = free_port()
    exporter = Exporter(service_app("orders"), rabbitmq.management, interval=0.5, worker_timeout=2, forget_after=6)
    server = exporter.serve("127.0.0.1", port)
    try:
        # The management API refreshes each queue's figures on its own timer (5 s), so the
        # archived message and the worker's consumer can show up in different scrapes.
        def archive_and_consumer_counted() -> dict[str, float]:
            metrics = scrape(port)
            seen = (
                value(metrics, "amqp_events_queue_messages_ready", queue="orders.archive", kind="archive") == 1
                and value(metrics, "amqp_events_queue_consumers", queue="orders:test.ping", kind="main") == 1
                and value(metrics, "amqp_events_workers_online", service="orders") == 1
            )
            return metrics if seen else {}

        metrics = wait_for(archive_and_consumer_counted, 30, what="archive, consumer and worker in the metrics")
        assert value(metrics, "amqp_events_queue_max_length", queue="orders.archive") == 10_000
        assert value(metrics, "amqp_events_queue_messages_ready", kind="delay") == 0
        assert value(metrics, "amqp_events_worker_up", service="orders") == 1
        assert value(metrics, "amqp_events_exporter_last_collection_timestamp_seconds") > 0

        process.kill()  # SIGKILL: no "offline" heartbeat
        wait_for(lambda: value(scrape(port), "amqp_events_worker_up", service="orders") == 0, 10, what="worker down")
        assert "amqp_events_workers_online" in "".join(scrape(port))

        def forgotten() -> bool:
            metrics = scrape(port)
            gone = not any(key.startswith("amqp_events_worker_up{") for key in metrics)
            return gone and value(metrics, "amqp_events_workers_online", service="orders") == 0

        wait_for(forgotten, 15, what="the dead worker's series dropped, the service total still present")
    finally:
        exporter.stop()
        server.shutdown()


def test_a_worker_removes_the_metrics_directory_it_made_when_it_stops(worker, tmp_path):
    def made() -> list[str]:
        return [path.name for path in tmp_path.iterdir() if path.name.startswith("amqp-events-metrics-")]

    process = worker("orders", pool="prefork", env={"AMQP_EVENTS_METRICS_PORT": str(free_port())})
    assert made()
    assert process.stop() == 0
    assert made() == []


def test_an_unreachable_broker_counts_as_a_collection_error_and_keeps_the_queues(worker, service_app):
    worker("orders").stop()  # its queues exist
    app = service_app("orders")
    exporter = Exporter(app, None, interval=3600)  # passive declares; collected by hand below
    exporter.collect_once()
    collected = {stats.name for stats in exporter.queues}
    assert "orders:test.ping" in collected and exporter.errors == 0
    app.conf.broker_url = "amqp://guest:guest@127.0.0.1:9//"  # connection refused from now on
    exporter.collect_once()
    assert {stats.name for stats in exporter.queues} == collected  # no queue reads as gone
    errors = {family.name: family for family in exporter.collect()}["amqp_events_exporter_collection_errors"]
    assert errors.samples[0].value == 1


def test_the_exporter_command_serves_queue_and_worker_metrics(worker, broker_url, rabbitmq, tmp_path):
    """``amqp-events -A services.orders exporter`` through the installed entry point, as the metrics guide runs it."""
    import os
    import subprocess

    from helpers import AMQP_EVENTS, TESTS

    from amqp_events.local.processes import terminate

    worker("orders")
    port = free_port()
    environment = {**os.environ, "BROKER_URL": broker_url, "PYTHONPATH": str(TESTS)}
    environment["AMQP_EVENTS_QUORUM_QUEUE_WARNING"] = "5"  # the orders service's queues pass it
    command = [AMQP_EVENTS, "-A", "services.orders", "--management-url", rabbitmq.management.base_url,
               "exporter", "--port", str(port), "--interval", "1"]  # fmt: skip
    with (tmp_path / "exporter.log").open("wb") as log:
        exporter = subprocess.Popen(command, env=environment, cwd=TESTS, stdout=log, stderr=subprocess.STDOUT)
    try:

        def collected() -> dict[str, float]:
            assert exporter.poll() is None, (tmp_path / "exporter.log").read_text()
            try:
                metrics = scrape(port)
            except OSError:
                return {}
            return metrics if value(metrics, "amqp_events_workers_online", service="orders") >= 1 else {}

        metrics = wait_for(collected, 30, what="the exporter's first collection with the worker online")
        consumers = [
            key for key in metrics if key.startswith("amqp_events_queue_consumers{") and "orders:test.ping" in key
        ]
        assert len(consumers) == 1  # the series is there (value() gives 0.0 for one that is missing)
        assert any(key.startswith("amqp_events_queue_messages_ready{") for key in metrics)
        assert (
            value(metrics, "amqp_events_vhost_quorum_queues") > value(metrics, "amqp_events_quorum_queue_warning") == 5
        )
    finally:
        terminate(exporter.pid, 10)
    assert "quorum queues, more than amqp_events_quorum_queue_warning (5)" in (tmp_path / "exporter.log").read_text()
