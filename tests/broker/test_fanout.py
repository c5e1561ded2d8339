"""Fan-out to services, load sharing inside a service, and what a pure producer does (real broker)."""

from __future__ import annotations

import inspect
import logging
import time
import uuid

import pytest

from amqp_events import DuplicateHandler, SettingsFrozen, events_app
from amqp_events.topology import event_queue_name


def test_each_subscribed_service_gets_each_event_once(worker, producer, records):
    worker("orders")
    worker("shipping")
    ids = [producer.fire("test.ping", ["t"], {}) for _ in range(20)]
    for service in ("orders", "shipping"):
        seen = records.wait(20, service=service)
        assert sorted(record["id"] for record in seen) == sorted(ids)
    records.barrier(producer, ("orders", "shipping"))  # nothing more may arrive
    assert len(records.all()) == 40


def test_two_workers_of_one_service_share_the_events_without_duplicates(worker, producer, records):
    first, second = worker("orders"), worker("orders")
    ids = [producer.fire("test.ping", [str(n)], {"how": {"sleep": 0.05}}) for n in range(40)]
    seen = records.wait(40, service="orders")
    assert sorted(record["id"] for record in seen) == sorted(ids)
    assert {record["pid"] for record in seen} == {first.pid, second.pid}
    records.barrier(producer, ("orders",), workers=2)
    assert len(records.all()) == 40


def test_events_fired_before_any_worker_runs_are_handled_once_it_starts(worker, producer, records):
    worker("orders").stop()  # its queues exist now, no worker runs
    ids = [producer.fire("test.ping", [str(n)], {}) for n in range(5)]
    worker("orders")
    assert sorted(r["id"] for r in records.wait(5, service="orders")) == sorted(ids)


def queue_depth(app, queue: str) -> int:
    with app.connection_for_write() as connection:
        return connection.default_channel.queue_declare(queue, passive=True).message_count


def test_a_validation_error_publishes_nothing(worker, broker_url, records):
    worker("orders").stop()  # declares the queues; nothing consumes them now
    app = events_app("tests", broker_url=broker_url)

    @app.event("billing.invoice.paid")
    def invoice_paid(invoice_id: int, amount: str):
        """An invoice was paid."""
        if not amount:
            raise ValueError("amount required")

    queue = event_queue_name("orders", "billing.invoice.paid")
    with pytest.raises(ValueError, match="amount required"):
        invoice_paid(1, "")
    assert queue_depth(app, queue) == 0
    invoice_paid(2, "10.00")
    assert queue_depth(app, queue) == 1
    # the decorated event keeps the function's identity
    assert invoice_paid.__name__ == "invoice_paid" and invoice_paid.__doc__ == "An invoice was paid."
    assert list(inspect.signature(invoice_paid).parameters) == ["invoice_id", "amount"]
    app.close()


def test_firing_an_event_nobody_subscribes_to_succeeds_and_warns_the_first_time(producer, caplog):
    name = f"nobody.listens{uuid.uuid4().hex[:6]}"
    with caplog.at_level(logging.DEBUG, logger="amqp_events"):
        assert producer.fire(name, [1], {}) and producer.fire(name, [2], {})
    said = [r.levelno for r in caplog.records if "no service subscribes" in r.message]
    assert said == [logging.WARNING, logging.DEBUG]


def test_the_cli_says_when_no_service_subscribes_and_suggests_a_close_name(worker, cli_process):
    worker("orders")
    typo = cli_process("fire", "billing.invoice.piad", "--json", '[1, "2.00"]')
    assert typo.returncode == 1
    assert "no service subscribes to 'billing.invoice.piad'" in typo.stderr
    assert "did you mean 'billing.invoice.paid'" in typo.stderr


def test_a_pure_producer_declares_no_queue(producer, rabbitmq, vhost):
    @producer.event("billing.invoice.paid")
    def invoice_paid(invoice_id: int, amount: str): ...

    invoice_paid(1, "1.00")
    producer.fire("test.ping", ["x"], {})
    assert rabbitmq.management.queues(vhost) == []
    assert "events" in {exchange["name"] for exchange in rabbitmq.management.exchanges(vhost)}


def test_a_second_handler_for_the_same_event_is_an_error_naming_both():
    app = events_app("orders", broker_url="amqp://localhost//")

    @app.handler("billing.invoice.paid")
    def first(invoice_id, amount): ...

    with pytest.raises(DuplicateHandler) as error:

        @app.handler("billing.invoice.paid")
        def second(invoice_id, amount): ...

    message = str(error.value)
    assert "'billing.invoice.paid'" in message and "first" in message and "second" in message


def test_current_event_gives_the_fire_time_and_the_producer(worker, producer, records):
    worker("orders")
    before = time.time()
    event_id = producer.fire("test.ping", ["meta"], {})
    [record] = records.wait(1)
    assert record["id"] == event_id and record["event"] == "test.ping"
    assert record["fired_by"] is None and record["attempt"] == 1  # a user shared with the worker: none verified
    from datetime import datetime

    fired_at = datetime.fromisoformat(record["fired_at"]).timestamp()
    assert before - 1 <= fired_at <= record["time"]


def test_queue_names_follow_the_documented_pattern():
    assert event_queue_name("orders", "billing.invoice.paid") == "orders:billing.invoice.paid"


def test_a_setting_changed_after_creation_reaches_the_broker(broker_url, rabbitmq, vhost):
    app = events_app("tests", broker_url=broker_url)
    app.conf.amqp_events_exchange = "company.events"
    app.fire("test.ping", ["x"], {})
    assert "company.events" in {exchange["name"] for exchange in rabbitmq.management.exchanges(vhost)}
    with pytest.raises(SettingsFrozen):
        app.conf.amqp_events_exchange = "events"
    app.close()
