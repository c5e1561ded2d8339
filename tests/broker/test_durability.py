"""Events and delayed retries survive a restart of the broker (real broker, restarted by the test)."""

from __future__ import annotations

import time

import pytest
from helpers import assert_broker_waited


@pytest.fixture
def node(rabbitmq):
    if rabbitmq.node is None:
        pytest.skip("needs the harness's own node (not $AMQP_URL) to restart it")
    return rabbitmq.node


def test_events_fired_before_a_broker_restart_are_handled_after_it(node, worker, producer, records):
    worker("orders").stop()
    ids = [producer.fire("test.ping", [str(n)], {}) for n in range(5)]
    node.stop()
    node.start()
    worker("orders")
    assert sorted(r["id"] for r in records.wait(5)) == sorted(ids)


def test_a_delayed_retry_survives_a_broker_crash_and_is_never_early(node, worker, producer, records):
    process = worker("orders")
    time.sleep(3)  # RabbitMQ 3.10 can lose a quorum queue declared ~2 s before a crash (RELIABILITY.md)
    producer.fire("test.ping", ["slow"], {"how": {"countdown": 12}})
    [first] = records.wait(1)
    process.stop()
    node.kill()  # a crash, not a clean stop
    node.start()
    worker("orders")
    first, second = records.wait(2, timeout=60)
    assert_broker_waited(second["time"] - first["time"], 12)


def test_firing_while_the_broker_is_down_raises_within_the_timeout_naming_the_event(node, broker_url, worker, records):
    from amqp_events import PublishError, events_app

    worker("orders")
    app = events_app("tests", broker_url=broker_url, amqp_events_publish_timeout=3)
    app.fire("test.ping", ["warm up"], {})
    records.wait(1, tag="warm up")
    node.stop()
    try:
        started = time.monotonic()
        with pytest.raises(PublishError, match="within 3s") as raised:
            app.fire("test.ping", ["lost?"], {})
        assert time.monotonic() - started < 30  # bounded (3 s, plus at most one connection attempt): never hangs
    finally:
        node.start()
    [maybe_lost] = raised.value.event_ids
    # Fired again under the same id (the pool reconnects by itself): an inbox would see one event, not two.
    assert app.fire("test.ping", ["lost?"], {}, event_id=maybe_lost) == maybe_lost
    assert [r["id"] for r in records.wait(1, timeout=60, tag="lost?")] == [maybe_lost]
    app.close()


def test_a_rate_limit_s_window_keeps_its_count_through_a_broker_crash(node, worker, producer, records):
    """The starts a window counted are persistent messages: a crash of the broker does not hand the window's
    places out again."""
    process = worker("mailer", env={"RATE": "3/20s"})
    time.sleep(3)  # RabbitMQ 3.10 can lose a quorum queue declared ~2 s before a crash (RELIABILITY.md)
    for n in range(3):
        producer.fire("mail.paced", [], {"n": n})
    first = records.wait(3, 30, handler="paced", tag="start")
    process.stop()
    node.kill()  # a crash, not a clean stop
    node.start()
    worker("mailer", env={"RATE": "3/20s"})
    for n in range(3, 6):
        producer.fire("mail.paced", [], {"n": n})
    later = records.wait(6, 90, handler="paced", tag="start")[3:]
    # The broker counted the first three when it took them; each record is written a moment after (longer on a
    # loaded machine): the window's places handed out again would have started the later three at once.
    assert min(line["time"] for line in later) >= min(line["time"] for line in first) + 20 - 2
