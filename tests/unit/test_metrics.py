"""Metric label capping and worker up/down bookkeeping: pure, no broker."""

from __future__ import annotations

from amqp_events.exporter import WorkerStates
from amqp_events.metrics import OTHER, ExceptionLabels
from amqp_events.settings import Settings
from amqp_events.topology import service_topology
from amqp_events.topology.names import queue_kind


class E1(Exception): ...


class E2(Exception): ...


class E3(Exception): ...


def test_exception_labels_are_class_names_capped_per_handler():
    labels = ExceptionLabels(limit=2)
    assert [labels.label(e) for e in (E1(), E2(), E3(), E1("again"), E3())] == ["E1", "E2", OTHER, "E1", OTHER]


def test_a_silent_worker_goes_down_then_its_series_go_while_the_service_total_stays():
    states = WorkerStates(timeout=30, forget_after=300, services={"orders"})
    states.heard("orders", "w1@host", "online", now=0)
    states.heard("orders", "w2@host", "online", now=0)
    assert states.snapshot(now=10) == ({("orders", "w1@host"): 1, ("orders", "w2@host"): 1}, {"orders": 2})
    states.heard("orders", "w2@host", "online", now=40)
    assert states.snapshot(now=45) == ({("orders", "w1@host"): 0, ("orders", "w2@host"): 1}, {"orders": 1})
    assert states.snapshot(now=400) == ({}, {"orders": 0})


def test_an_offline_heartbeat_is_down_at_once():
    states = WorkerStates(timeout=30, forget_after=300)
    states.heard("shipping", "w@host", "offline", now=0)
    assert states.snapshot(now=1) == ({("shipping", "w@host"): 0}, {"shipping": 0})


def test_queue_kinds():
    topology = service_topology("orders", ["a.b"], Settings())
    kinds = {queue.name: queue_kind(queue.name, topology.service) for queue in topology.queues}
    assert kinds["orders:a.b"] == "main" and kinds["orders.archive"] == "archive"
    assert kinds["amqp_events.delay.03"] == "delay" and kinds["amqp_events.unroutable"] == "unroutable"
