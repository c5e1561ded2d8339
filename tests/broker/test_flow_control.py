"""Flow control over the fleet, on RabbitMQ: ``concurrency=`` (per handler and per key) and ``rate_limit=`` hold
over several workers, a worker killed mid-run gives its lease back, and what waits over a limit is never an
attempt (``tests/unit/test_flow_control.py``: the options, and the in-process mode on its virtual clock)."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest
from helpers import AMQP_EVENTS, TESTS, queue_state, wait_archived
from kombu import Connection

from amqp_events import Reason
from amqp_events.testing import wait_for
from amqp_events.topology.limits import lease_names, limit_prefix
from amqp_events.transport.leases import Leases

pytestmark = pytest.mark.broker


def limits(broker_url: str, *args: str, **env: str) -> str:
    """``amqp-events -A services.mailer limits ARGS``, through the installed command."""
    environment = {**os.environ, "BROKER_URL": broker_url, "PYTHONPATH": str(TESTS), **env}
    done = subprocess.run(
        [AMQP_EVENTS, "-A", "services.mailer", "limits", *args],
        cwd=TESTS, env=environment, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def limits_show(broker_url: str, **env: str) -> str:
    return limits(broker_url, "show", **env)


def intervals(records, handler: str) -> dict[int, tuple[float, float]]:
    """Each run's (start, end) by its number, from the records of ``handler``'s runs that ended."""
    runs = records.all(service="mailer", handler=handler)
    starts = {line["n"]: line["time"] for line in runs if line["tag"] == "start"}
    return {line["n"]: (starts[line["n"]], line["time"]) for line in runs if line["tag"] == "end"}


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most runs that overlapped at any moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in edges:  # at one instant an end (-1) sorts before a start: touching is not overlapping
        running += step
        most = max(most, running)
    return most


def test_concurrency_holds_over_three_workers_and_a_wait_is_never_an_attempt(worker, producer, records):
    for _ in range(3):
        worker("mailer", env={"CONCURRENCY": "2"})
    for n in range(24):
        producer.fire("mail.send", [], {"n": n, "sleep": 0.2})
    wait_for(lambda: len(intervals(records, "send")) == 24, 120, what="24 runs of mail.send")
    runs = intervals(records, "send")
    assert most_at_once(list(runs.values())) == 2  # the limit, reached and never passed
    starts = records.all(service="mailer", handler="send", tag="start")
    assert sorted(line["n"] for line in starts) == list(range(24))  # each once
    assert {line["attempt"] for line in starts} == {1}  # waits over the limit are not attempts


def test_a_process_killed_mid_run_gives_its_lease_back_and_the_others_go_on(
    worker, producer, records, archive_of, broker_url
):
    # The consuming pool, whose killed process is replaced; a run lost once is archived (not run again).
    worker("mailer", pool=None, concurrency=1, env={"CONCURRENCY": "1", "MAX_DELIVERIES": "1"})
    slow = producer.fire("mail.send", [], {"n": 100, "sleep": 60})
    [started] = records.wait(1, 30, handler="send", tag="start", n=100)
    assert "running now: 1" in limits_show(broker_url, CONCURRENCY="1")  # the lease, seen from outside
    os.kill(started["pid"], signal.SIGKILL)  # ... and given back when the process's connection closed
    wait_for(lambda: "running now: 0" in limits_show(broker_url, CONCURRENCY="1"), 30, what="the lease given back")
    poison = producer.fire("mail.send", [], {"n": 0, "kill": True})
    for n in range(1, 6):
        producer.fire("mail.send", [], {"n": n, "sleep": 0.05})
    wait_for(lambda: len(intervals(records, "send")) == 5, 120, what="the five runs after the killed one")
    archived = wait_archived(archive_of("mailer"), 2, timeout=120)
    assert {message.id for message in archived} == {slow, poison}
    assert {message.reason for message in archived} == {Reason.WORKER_LOST}
    assert most_at_once(list(intervals(records, "send").values())) == 1


def test_concurrency_per_key_holds_each_key_and_lets_the_others_go(worker, producer, records):
    worker("mailer")
    worker("mailer")
    for n in range(4):  # the last hot run starts some 4.5 s on: the four cold ones, in turn, end before it
        producer.fire("mail.per_account", [], {"account": "hot", "n": n, "sleep": 1.5})
    for n in range(10, 14):
        producer.fire("mail.per_account", [], {"account": "cold", "n": n})
    wait_for(lambda: len(intervals(records, "per_account")) == 8, 120, what="eight runs of mail.per_account")
    runs = intervals(records, "per_account")
    hot = [span for n, span in runs.items() if n < 10]
    cold = [span for n, span in runs.items() if n >= 10]
    assert most_at_once(hot) == 1 and most_at_once(cold) == 1  # one at a time per account
    assert max(end for _, end in cold) < max(start for start, _ in hot)  # the cold account did not wait for the hot


def test_a_rate_limit_holds_over_two_workers_in_every_window(worker, producer, records, cli_process):
    worker("mailer", env={"RATE": "10/3s"})
    worker("mailer", env={"RATE": "10/3s"})
    for n in range(35):
        producer.fire("mail.paced", [], {"n": n})
    starts = records.wait(35, 120, handler="paced", tag="start")
    shown = cli_process("limits", "show", app="services.mailer", env={"RATE": "10/3s"}).stdout
    assert "mail.paced  (services.mailer.paced)  10/3s" in shown
    counted = re.search(r"started in the last 0.6 s \(paced, 2 at most\): (\d+)", shown)  # 10 in 3 s, evenly
    assert counted and int(counted.group(1)) <= 2, shown
    times = sorted(line["time"] for line in starts)
    # The broker counts when it takes a start; a record is written a moment after: a window a little shorter
    # than the limit's tells the limit without that moment's jitter. (How close to the limit a backlog runs
    # depends on the machine's load: not asserted.)
    assert max(sum(1 for t in times if first <= t < first + 2.0) for first in times) <= 10
    assert sorted(line["n"] for line in starts) == list(range(35))
    assert {line["attempt"] for line in starts} == {1}


def test_starts_taken_several_at_a_time_by_three_busy_workers_still_hold_the_limit_in_every_window(
    worker, producer, records
):
    """A large window is counted several starts per message (a process that runs quickly takes them ahead): the
    limit holds over three workers all the same, and the window of a minute holds the 300 starts in fewer
    messages."""
    for _ in range(3):
        worker("mailer", env={"RATE": "100/3s,1000/m"})
    for n in range(300):
        producer.fire("mail.paced", [], {"n": n})
    starts = records.wait(300, 120, handler="paced", tag="start")
    times = sorted(line["time"] for line in starts)
    assert max(sum(1 for t in times if first <= t < first + 2.5) for first in times) <= 100
    assert sorted(line["n"] for line in starts) == list(range(300))
    assert {line["attempt"] for line in starts} == {1}
    minute = f"{limit_prefix('mailer', 'mail.paced')}.1000per60s"
    assert queue_state(producer, minute)[0] < 300  # several starts per message (none expired yet: a minute)


def test_a_handler_whose_breaker_closes_after_an_outage_drains_its_backlog_at_its_limit(worker, producer, records, cli):
    worker("mailer", env={"RATE": "10/3s"})
    worker("mailer", env={"RATE": "10/3s"})
    queue = "mailer:mail.paced"
    consumers = lambda: queue_state(producer, queue)  # noqa: E731
    wait_for(lambda: consumers()[1] == 2, 30, what="both workers consuming")
    opened = cli("breakers", "open", "paced", app="services.mailer")  # the provider is down: an operator's hold
    assert "open: 2 worker(s)" in opened.output, opened.output
    for n in range(30):
        producer.fire("mail.paced", [], {"n": n})
    assert consumers() == (30, 0) and records.all() == []  # the backlog waits in its queue
    closed = cli("breakers", "close", "paced", app="services.mailer")
    assert "close: 2 worker(s)" in closed.output, closed.output
    starts = records.wait(30, 120, handler="paced", tag="start")
    times = sorted(line["time"] for line in starts)
    assert max(sum(1 for t in times if first <= t < first + 2.0) for first in times) <= 10  # within its limit
    assert sorted(line["n"] for line in starts) == list(range(30))
    assert {line["attempt"] for line in starts} == {1}


def test_a_limit_set_at_run_time_is_in_force_in_every_worker_until_reset(worker, producer, records, broker_url):
    for _ in range(2):  # four processes that each consume: what runs at once is the limit's, not the pool's
        # (each holding only the event it runs: a process would run what it prefetched one after the other)
        worker("mailer", "--prefetch-multiplier", "1", pool=None, concurrency=2, env={"CONCURRENCY": "1"})
    for n in range(4):
        producer.fire("mail.send", [], {"n": n, "sleep": 0.3})
    wait_for(lambda: len(intervals(records, "send")) == 4, 60, what="four runs at the code's limit")
    assert most_at_once(list(intervals(records, "send").values())) == 1

    assert "mail.send: concurrency 3 (set at run time)" in limits(
        broker_url, "set", "send", "--concurrency", "3", CONCURRENCY="1"
    )
    assert "concurrency 3  (set at run time" in limits_show(broker_url, CONCURRENCY="1")
    for n in range(10, 22):
        producer.fire("mail.send", [], {"n": n, "sleep": 1.0})
    wait_for(lambda: len(intervals(records, "send")) == 16, 120, what="twelve runs at the limit set")
    after = [span for n, span in intervals(records, "send").items() if n >= 10]
    assert most_at_once(after) == 3  # every worker took the new limit, without a restart, and none passed it

    assert "mail.send: concurrency 1" in limits(broker_url, "set", "send", "--reset", CONCURRENCY="1")
    assert "set at run time" not in limits_show(broker_url, CONCURRENCY="1")
    for n in range(30, 38):
        producer.fire("mail.send", [], {"n": n, "sleep": 0.5})
    wait_for(lambda: len(intervals(records, "send")) == 24, 120, what="eight runs after the reset")
    # The reset reaches each worker a moment after it is written: the last runs are back at the code's limit.
    last = sorted(span for n, span in intervals(records, "send").items() if n >= 30)[-4:]
    assert most_at_once(last) == 1
    starts = records.all(service="mailer", handler="send", tag="start")
    assert {line["attempt"] for line in starts} == {1}


def test_a_lease_kept_for_the_process_s_next_run_is_given_back_when_none_comes(broker_url):
    """A process keeps a lease a moment after its run, so that a run of the same handler right after takes it
    without asking the broker; with no such run, the lease goes back and another process takes it."""
    names = lease_names(limit_prefix("mailer", "mail.send"), 1)
    first, second = (Leases(lambda: Connection(broker_url, heartbeat=0)) for _ in range(2))
    try:
        assert first.hold(names) == names[0]
        first.release(names[0])
        assert first.hold(names) == names[0]  # its next run: the one it kept
        first.release(names[0])
        assert wait_for(lambda: second.hold(names), 10, what="the lease given back") == names[0]
        assert first.hold(names) is None  # the other process holds it now
    finally:
        first.close()
        second.close()
