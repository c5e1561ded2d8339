"""How an event over its limit waits, on RabbitMQ: in its own queue, in the queue's order, at an even pace, never
on the delay ladder; each key's events in order while the others go on; per-key state bounded however many keys
senders choose; a process killed while it holds an event gives it back unrun; a window of another shape named with
the command that fixes it (``tests/broker/test_flow_control.py``: the limits themselves)."""

from __future__ import annotations

import itertools
import os
import signal

import pytest
from helpers import queue_state
from kombu import Connection, Exchange, Queue

from amqp_events.testing import wait_for
from amqp_events.topology import delays
from amqp_events.topology.limits import limit_prefix

pytestmark = pytest.mark.broker


class LadderTap:
    """A queue of the test's own bound to the service's delay ladder's entry: a copy of every message that waits
    there."""

    def __init__(self, broker_url: str, service: str) -> None:
        self.connection = Connection(broker_url)
        self.queue = Queue(
            f"test.tap.{service}", Exchange(delays.own_entry(service), "topic", passive=True), routing_key="#"
        )
        self.queue(self.connection.default_channel).declare()

    def count(self) -> int:
        return self.connection.default_channel.queue_declare(self.queue.name, passive=True).message_count

    def close(self) -> None:
        self.connection.close()


def starts_of(records, handler: str = "paced") -> list[dict]:
    return sorted(records.all(service="mailer", handler=handler, tag="start"), key=lambda line: line["time"])


def most_in(times: list[float], seconds: float) -> int:
    return max(sum(1 for t in times if first <= t < first + seconds) for first in times)


def test_a_backlog_over_its_rate_waits_in_its_queue_evenly_paced_and_never_on_the_ladder(
    worker, producer, records, broker_url
):
    for _ in range(3):  # Celery's default pool, two processes each, at Celery's default prefetch
        worker("mailer", pool=None, concurrency=2, env={"RATE": "120/m"})
    tap = LadderTap(broker_url, "mailer")
    try:
        for n in range(40):
            producer.fire("mail.paced", [], {"n": n})
        # Each process takes up to its prefetch (4) at first; from the first event that waits, one at a time: the
        # rest of the backlog stays in its queue, going down as events start.
        waiting = []
        for _ in range(6):
            records.wait(len(records.all(handler="paced")) + 1, 30, handler="paced")
            waiting.append(queue_state(producer, "mailer:mail.paced")[0])
        starts = records.wait(40, 120, handler="paced", tag="start")
        assert tap.count() == 0  # not one event went through the delay ladder
    finally:
        tap.close()
    assert waiting == sorted(waiting, reverse=True) and waiting[0] >= 40 - 3 * 2 * 4 - 2, waiting
    times = sorted(line["time"] for line in starts)
    # Evenly: two starts a second, not 120 at once. A second's two may start together, so a window can hold the two
    # of one second and, a few milliseconds early, those of the next: 2 per second, plus one second's two.
    assert most_in(times, 1.0) <= 2 + 2
    assert most_in(times, 5.0) <= 2 * 5 + 2
    # And the allowance used: 39 half-second spacings; at one a second (half the rate) it would take twice that.
    assert times[-1] - times[0] < 19.5 * 1.75
    assert sorted(line["n"] for line in starts) == list(range(40))
    assert {line["attempt"] for line in starts} == {1}


def test_one_worker_starts_a_backlog_in_the_order_it_was_fired(worker, producer, records):
    worker("mailer", env={"RATE": "120/m"})  # paced by two a second
    for n in range(16):
        producer.fire("mail.paced", [], {"n": n})
    starts = records.wait(16, 60, handler="paced", tag="start")
    assert [line["n"] for line in sorted(starts, key=lambda line: line["time"])] == list(range(16))


def test_each_key_s_events_start_in_order_and_keys_do_not_wait_for_each_other(worker, producer, records):
    worker("mailer", pool=None, concurrency=1, env={"KEY_RATE": "60/m"})
    accounts = ["a", "b", "c", "d", "e"]
    for n, account in enumerate(itertools.islice(itertools.cycle(accounts), 25)):
        producer.fire("mail.per_key_paced", [], {"account": account, "n": n})
    starts = records.wait(25, 60, handler="per_key_paced", tag="start")
    for account in accounts:
        ordered = [line["n"] for line in sorted(starts, key=lambda line: line["time"]) if line["account"] == account]
        assert ordered == sorted(ordered) and len(ordered) == 5, (account, ordered)
    times = sorted(line["time"] for line in starts)
    # Five keys at once: about four one-second spacings. Had keys waited for each other, twenty-four: the bound lies
    # between the two, far enough from each for a loaded machine.
    assert times[-1] - times[0] < 24 / 2


def test_ten_thousand_keys_leave_at_most_the_bound_of_windows_on_the_broker(worker, producer, records, rabbitmq):
    worker("mailer", env={"KEY_RATE": "100/s", "LIMIT_KEYS": "32"})
    with producer.batch():
        for n in range(10_000):
            producer.fire("mail.per_key_paced", [], {"account": f"tenant-{n}", "n": n})
    records.wait(10_000, 180, handler="per_key_paced", tag="start")
    prefix = limit_prefix("mailer", "mail.per_key_paced", "x").rpartition(".key.")[0] + ".key."
    vhost = producer.connection_for_read().virtual_host
    windows = [queue["name"] for queue in rabbitmq.management.queues(vhost) if queue["name"].startswith(prefix)]
    assert 0 < len(windows) <= 32  # one per bucket of keys, however many keys
    producer.fire("mail.paced", [], {"n": 1})  # and the worker goes on serving
    records.wait(1, 30, handler="paced", tag="start")


def test_a_process_killed_while_it_holds_an_event_over_its_limit_gives_it_back_unrun(
    worker, producer, records, archive_of
):
    # One start in any 20 s: the second event is still held when its process is killed, however slowly the test
    # gets there on a loaded machine.
    started = worker("mailer", pool=None, concurrency=1, env={"RATE": "2/40s"})
    producer.fire("mail.paced", [], {"n": 0})
    records.wait(1, 30, handler="paced", tag="start", n=0)
    producer.fire("mail.paced", [], {"n": 1})
    wait_for(lambda: queue_state(producer, "mailer:mail.paced")[0] == 0, 10, what="the second event held")
    [process] = started.children()
    os.kill(process, signal.SIGKILL)  # it holds the second event, unacked, waiting for its start
    [second] = records.wait(1, 90, handler="paced", tag="start", n=1)
    assert second["attempt"] == 1 and second["pid"] != process  # run once, by the process that replaced it
    assert archive_of("mailer").list() == []  # not a lost run: it never started


def test_a_window_of_another_shape_names_the_command_that_fixes_it_and_its_events_wait(
    worker, producer, records, broker_url
):
    name = f"{limit_prefix('mailer', 'mail.paced')}.1per1s"  # "60/m", paced, as an earlier build declared it
    with Connection(broker_url) as connection:
        Queue(name, durable=True, queue_arguments={"x-max-length-bytes": 1, "x-message-ttl": 999})(
            connection.default_channel
        ).declare()
    running = worker("mailer", env={"RATE": "60/m"})
    producer.fire("mail.paced", [], {"n": 0})
    wait_for(lambda: "rabbitmqctl delete_queue -p" in running.log(), 30, what="the error naming the command")
    assert f" {name}" in running.log() and records.all(handler="paced") == []  # it waits, unrun, not failed
    with Connection(broker_url) as connection:
        connection.default_channel.queue_delete(name)
    [start] = records.wait(1, 30, handler="paced", tag="start")
    assert start["attempt"] == 1
