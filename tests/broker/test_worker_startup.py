"""What a worker does at start-up: declare its topology, or stop with a clear message (real broker)."""

from __future__ import annotations

import re
import threading

import pytest
from kombu import Connection

from amqp_events import TopologyMismatch, events_app
from amqp_events.settings import Settings
from amqp_events.testing import wait_for
from amqp_events.topology import delays, service_topology
from amqp_events.topology.layout import DELIVERY_LIMIT, PLACEMENT, earlier_dead_lettering
from amqp_events.transport.declare import declare_topology


def test_a_worker_declares_the_whole_topology_and_nothing_else(worker, rabbitmq, vhost):
    worker("orders")
    queues = {queue["name"]: queue for queue in rabbitmq.management.queues(vhost)}
    assert "orders:test.ping" in queues and "orders.archive" in queues
    assert len([name for name in queues if name.startswith("amqp_events.delay.")]) == 22
    assert queues["orders:test.ping"]["arguments"]["x-queue-type"] == "quorum"
    expected = {queue.name for queue in events_app("orders").topology.queues}  # no handler: shared + archive
    own_ladder = {delays.own_level_name("orders", level) for level in range(delays.LEVELS)}
    assert own_ladder <= set(queues)  # where its retries wait
    others = set(queues) - expected - own_ladder
    # the six event queues of services/orders.py, and Celery's own remote-control queue (auto-deleted)
    assert {name for name in others if not name.endswith(".orders.control.pidbox")} == {
        "orders:billing.invoice.paid",
        "orders:test.orders_only",
        "orders:test.sections",
        "orders:test.ping",
        "orders:users.registered",
        "orders:users.registered_model",
    }


def test_a_queue_with_other_arguments_stops_the_worker_with_a_clear_message(worker, broker_url):
    with Connection(broker_url) as connection:  # a classic queue, declared by hand
        connection.default_channel.queue_declare("orders:test.ping", durable=True, auto_delete=False)
    process = worker("orders", ready=False)
    assert process.wait(60) is not None, "the worker kept running"
    assert process.process.returncode != 0
    log = process.log()
    # The argument and both values (which differing argument the broker names first depends on its version).
    assert "queue 'orders:test.ping'" in log
    assert re.search(r"already exists with (x-[\w-]+)=.+?, but this service declares \1=", log), log
    assert "rabbitmqctl delete_queue 'orders:test.ping'" in log  # how to fix it
    assert " ready." not in log


def test_topology_mismatch_names_queue_argument_values_and_fix(broker_url):
    app = events_app("orders", broker_url=broker_url, amqp_events_archive_max_length=5)
    app.declare_topology()
    changed = events_app("orders", broker_url=broker_url, amqp_events_archive_max_length=6)
    with pytest.raises(TopologyMismatch) as error, changed.connection_for_write() as connection:
        declare_topology(connection, changed.topology)
    message = str(error.value)
    assert "queue 'orders.archive'" in message
    assert "x-max-length=5" in message.replace("'", "") and "x-max-length=6" in message.replace("'", "")
    assert error.value.name == "orders.archive" and error.value.argument == "x-max-length"
    app.close()
    changed.close()


def test_a_queue_of_an_earlier_version_without_replica_placement_is_kept(worker, broker_url, cli, records):
    """0.2 declared quorum queues without replica placement and delivery limit, dead-lettering through the delivery
    exchange: upgrading must not stop workers."""
    [queue] = service_topology("orders", ["test.ping"], Settings()).event_queues
    earlier = {key: value for key, value in queue.queue_arguments.items() if key not in (*PLACEMENT, DELIVERY_LIMIT)}
    earlier.update(earlier_dead_lettering(queue.name))
    with Connection(broker_url) as connection:
        connection.default_channel.queue_declare(queue.name, durable=True, auto_delete=False, arguments=earlier)
    process = worker("orders")
    assert "were kept as they are" in process.log() and "orders:test.ping" in process.log()
    checked = cli("topology", "check")
    assert checked.exit_code == 0, checked.output
    assert (
        "note queue 'orders:test.ping': created without x-quorum-initial-group-size, x-queue-leader-locator, "
        "x-delivery-limit; created with x-dead-letter-exchange='amqp_events.delivery'" in checked.output
    )
    producer = events_app("billing", broker_url=broker_url)
    producer.fire("test.ping", ["after the upgrade"], {})
    [ran] = records.wait(1)
    assert ran["tag"] == "after the upgrade"
    producer.close()


def test_the_eventlet_pool_is_refused_with_a_message_that_names_gevent(worker):
    process = worker("orders", pool="eventlet", concurrency=10, ready=False)
    wait_for(lambda: not process.is_running(), 60, what="the worker to stop")
    assert "the eventlet pool is not supported" in process.log() and "-P gevent" in process.log()


def test_workers_starting_together_on_a_fresh_vhost_each_declare_the_topology(broker_url):
    """Processes of one service (a consuming pool's, or a fleet's) declare the same queues at the same moment: on
    RabbitMQ 3.10 a declaration racing another's creation of a durable queue may be told its home node is down."""
    app = events_app("orders", broker_url=broker_url)
    topology = app.topology
    barrier = threading.Barrier(6)
    failures: list[BaseException] = []

    def declare() -> None:
        with Connection(broker_url) as connection:
            connection.connect()
            barrier.wait(30)
            try:
                declare_topology(connection, topology)
            except Exception as error:  # what each process would stop with
                failures.append(error)

    threads = [threading.Thread(target=declare) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
    app.close()
