"""How events over their limit wait (bench/flow_control.py: the limits themselves): a backlog at ``rate_limit="60/m"``
over three workers of Celery's default pool, as the command is typed, against Celery's own ``rate_limit=`` on three
workers (its busiest minute and second); the order starts come in, with one key and with many, against Celery's on
one worker. Each run counts what went through the service's delay ladder while it waited (a queue of the
benchmark's own, bound to the ladder's entry)."""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Iterator

from kombu import Connection, Exchange, Queue

from amqp_events.topology import delays
from bench.flow_control import busiest, limited_app
from bench.harness import Bench, Run
from bench.scenarios import QUICK, Result, Size

#: Workers of the pace scenario, each Celery's default pool of two processes.
WORKERS = 3


@contextlib.contextmanager
def ladder_tap(run: Run, service: str = "bench") -> Iterator[Connection]:
    """A queue bound to ``service``'s delay ladder's entry: a copy of everything that waits there."""
    with Connection(run.url) as connection:
        queue = Queue("bench.ladder-tap", Exchange(delays.own_entry(service), "topic", passive=True), "#")
        queue(connection.default_channel).declare()
        yield connection


def tapped(connection: Connection) -> int:
    return int(connection.default_channel.queue_declare("bench.ladder-tap", passive=True).message_count)


def pace(bench: Bench, size: Size) -> Result:
    """A backlog of ``events`` at ``rate`` over three workers of Celery's default pool (``celery worker``, no
    ``-P``): the busiest window and second, the share of the allowance used, what went through the ladder."""
    events, rate, count = (40, "120/m", 120) if size == QUICK else (600, "60/m", 60)
    env = {"RATE": rate}
    with bench.run("limits-pace") as run:
        app = limited_app(run, **env)
        app.declare_topology()
        with ladder_tap(run) as tap:
            with app.batch():
                for n in range(events):
                    app.fire("bench.limited", kwargs={"n": n})
            app.close()
            with contextlib.ExitStack() as stack:
                for _ in range(WORKERS):
                    stack.enter_context(run.worker("limited", pool=None, concurrency=2, env=env, typed=True))
                run.wait_marks(lambda marks: len(marks) >= events, timeout=events * 60 / count * 1.5 + 120)
            ladder = tapped(tap)
        starts = sorted(mark["time"] for mark in run.marks_read())
    share = (len(starts) - 1) / (starts[-1] - starts[0]) / (count / 60)
    minute, second = busiest(starts, 60), busiest(starts, 1.0)
    celery_minute, celery_second = _celery_rate(bench, rate, count)
    met = minute <= count and share >= 0.95 and second <= 2 * count // 60 and ladder == 0
    return Result(
        f"{events} events at rate_limit='{rate}' over {WORKERS} workers (`celery worker`, 2 processes each)",
        f"at most {minute} started in any 60 s and {second} in any 1 s; {share:.1%} of the allowance used; "
        f"{ladder} through the delay ladder",
        f"Celery's rate_limit='{rate}' on {WORKERS} workers: {celery_minute} in its busiest 60 s "
        f"({celery_minute / count:.1f}x the limit), {celery_second} in its busiest second",
        share,
        f"<= {count} in every 60 s, >= 95% used, <= {2 * count // 60} in any 1 s, 0 through the ladder",
        met,
        {"ours (busiest 60 s)": minute, "Celery (busiest 60 s)": celery_minute},
    )


def _celery_rate(bench: Bench, rate: str, count: int) -> tuple[int, int]:
    """Celery's own ``rate_limit=`` on three workers as typed (its prefork pool), for a minute: its busiest minute
    and second."""
    with bench.run("limits-pace-celery") as run:
        os.environ.update({"BROKER_URL": run.url, "RATE": rate})
        import celery_limited

        plain = importlib.reload(celery_limited).app
        with plain.producer_or_acquire() as producer:
            for n in range(count * WORKERS * 2):
                plain.send_task("bench.limited", (n,), producer=producer)
        plain.close()
        with contextlib.ExitStack() as stack:
            for _ in range(WORKERS):
                stack.enter_context(run.worker("celery_limited", pool=None, concurrency=2, env={"RATE": rate}))
            first = run.wait_marks(lambda marks: bool(marks), timeout=120)[0]["time"]
            time.sleep(max(0.0, first + 60 - time.time()))
        starts = sorted(mark["time"] for mark in run.marks_read())
    return busiest(starts, 60), busiest(starts, 1.0)


def order(bench: Bench, size: Size) -> Result:
    """One worker, ``-c 1``: a backlog of one key's events at ``rate_limit="600/m"``, and of many keys' at
    ``"600/m"`` per key; the starts out of the order fired, against Celery's own ``rate_limit=`` on one worker."""
    events = 100 if size == QUICK else 600
    keys = 10
    with bench.run("limits-order") as run:
        app = limited_app(run, RATE="600/m", KEY_RATE="600/m")
        app.declare_topology()
        with ladder_tap(run) as tap:
            with app.batch():
                for n in range(events):
                    app.fire("bench.limited", kwargs={"n": n})
                    app.fire("bench.per_key_rate", kwargs={"n": n, "key": f"account-{n % keys}"})
            app.close()
            with run.worker("limited", pool=None, concurrency=1, env={"RATE": "600/m", "KEY_RATE": "600/m"}):
                run.wait_marks(lambda marks: len(marks) >= 2 * events, timeout=events / 10 * 1.5 + 120)
            ladder = tapped(tap)
        marks = sorted(run.marks_read(), key=lambda mark: mark["time"])
    one_key = _out_of_order([mark["n"] for mark in marks if mark["handler"] == "limited"])
    per_key = sum(
        _out_of_order([mark["n"] for mark in marks if mark["handler"] == "per_key_rate" and mark["key"] == key])
        for key in {mark["key"] for mark in marks if mark["handler"] == "per_key_rate"}
    )
    with bench.run("limits-order-celery") as run:
        os.environ.update({"BROKER_URL": run.url, "RATE": "600/m"})
        import celery_limited

        plain = importlib.reload(celery_limited).app
        with plain.producer_or_acquire() as producer:
            for n in range(events):
                plain.send_task("bench.limited", (n,), producer=producer)
        plain.close()
        # Celery's bucket with acks late starts about one a second here, not ten: what started in a while is
        # compared, not the whole backlog.
        with (
            run.worker("celery_limited", pool=None, concurrency=1, env={"RATE": "600/m"}),
            contextlib.suppress(TimeoutError),
        ):
            run.wait_marks(lambda marks: len(marks) >= events, timeout=events / 10 * 1.5 + 60)
        started = [mark["n"] for mark in sorted(run.marks_read(), key=lambda mark: mark["time"])]
        celery = _out_of_order(started)
    return Result(
        f"order of starts, one worker (-c 1): {events} events of one key, and {events} of {keys} keys, at 600/m "
        "(per key)",
        f"one key: {one_key} started before an event fired earlier; {keys} keys: {per_key}; {ladder} through the "
        "delay ladder",
        f"Celery's rate_limit='600/m' on one worker: {celery} out of order (of {len(started)} it started in "
        f"{events / 10 * 1.5 + 60:.0f} s)",
        None,
        "0 out of order (one key, and each key)",
        one_key == 0 and per_key == 0,
        {"ours (one key)": one_key, "ours (each key)": per_key, "Celery": celery},
    )


def _out_of_order(numbers: list[int]) -> int:
    """How many started after an event fired later had started."""
    highest, late = -1, 0
    for n in numbers:
        if n < highest:
            late += 1
        highest = max(highest, n)
    return late
