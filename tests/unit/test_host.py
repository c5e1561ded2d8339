"""What each of Celery's pools can do, as the worker reads it (:class:`amqp_events.celery.host.Host`). The green
pools are read by the workers that refuse them (``test_worker_startup``, ``test_coroutine_handlers``): importing
them here would patch this test process."""

from __future__ import annotations

from celery.concurrency import get_implementation

from amqp_events.celery.host import Host
from amqp_events.celery.pool import ConsumingPool


def host_of(kind: str, limit: int = 4) -> Host:
    pool = get_implementation(kind)(limit=limit)
    return Host.of(pool)


def test_solo_runs_in_the_consumer_s_thread():
    host = host_of("solo")
    assert host.runs_here and host.runs_in_the_consumers_thread and host.runs_at_once == 1
    assert not host.consumes_in_processes and host.apply_async is None and host.shared is None


def test_threads_run_here_in_its_threads_as_many_at_once_as_it_has():
    host = host_of("threads", limit=4)
    assert host.runs_here and not host.runs_in_the_consumers_thread and host.runs_at_once == 4
    assert host.apply_async is not None


def test_prefork_runs_elsewhere_in_its_child_processes():
    host = host_of("prefork")
    assert not host.runs_here and not host.consumes_in_processes and host.runs_at_once == 1
    assert not host.greenlets and not host.refused


def test_the_consuming_pool_s_processes_consume_and_its_main_process_runs_nothing():
    host = Host.of(ConsumingPool(limit=2))
    assert host.consumes_in_processes and not host.runs_here
