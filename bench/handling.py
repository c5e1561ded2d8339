"""Handling a backlog with two processes, side by side: ours, plain Celery, FastStream and a raw consumer.

Every contender drains the same number of no-op events waiting in a quorum
queue, with two processes and a prefetch of 16 per process (per thread or
child with ``-c 2``), in interleaved rounds; the rate is taken between the
events at 10% and 90% of the backlog, so that processes starting a moment
apart do not count. Ours and plain Celery run with each pool: two ``-P solo``
worker processes, ``-P threads -c 2``, ``-P prefork -c 2``. FastStream runs
``faststream run --workers 2`` (aio-pika), the raw consumer two py-amqp
processes that decode each body and ack it: the ceiling of a Python consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

from faststream.rabbit import RabbitBroker, RabbitQueue

from bench.harness import APPS, Bench, Run, legacy, legacy_python, median, steady_throughput
from bench.scenarios import Result, Size, ours_app, plain_app

#: pool, concurrency, worker processes: two processes' worth each.
SETUPS = (("solo", 1, 2), ("threads", 2, 1), ("prefork", 2, 1))
PREFETCH = 16
OURS_QUEUE = "bench:bench.noop"
#: FastStream's own queue, as ``RabbitQueue(name)`` declares it (bench/apps/faststream_own.py).
FASTSTREAM_QUEUE = "faststream-bench"
FASTSTREAM = str(Path(sys.executable).parent / "faststream")


def fill(run: Run, library: str, count: int, wait: bool = True) -> str:
    """``count`` no-op events waiting in the queue ``library`` consumes (``wait``: until all are there, no
    consumer taking them); returns the queue."""
    if library == "plain":
        run.plain_queue_type = "quorum"
        plain = plain_app(run)
        plain.conf.broker_transport_options = {"confirm_publish": False}  # filling is not measured
        with plain.producer_or_acquire() as producer:
            for n in range(count):
                plain.send_task("bench.noop", (n,), {"last": n == count - 1}, producer=producer)
        plain.close()
        queue = "plain"
    elif library == "faststream":  # its own publisher, format and queue
        asyncio.run(_faststream_publish(run.url, count))
        queue = FASTSTREAM_QUEUE
    elif library == "legacy":  # celery-amqp-events 0.1.0, in its own virtualenv
        with run.worker("legacy", python=legacy_python()):
            pass  # declares its queues
        legacy(run, "legacy_fire.py", str(count), "--last")
        queue = "legacy.bench.noop"
    else:  # ours, and the other consumers of the very same events
        app = ours_app(run)
        app.declare_topology()
        with app.batch():
            for n in range(count):
                app.fire("bench.noop", kwargs={"n": n, "last": n == count - 1})
        app.close()
        queue = OURS_QUEUE
    if wait:
        run.wait_depth(queue, count)
    return queue


async def _faststream_publish(url: str, count: int) -> None:
    """``count`` events published as a FastStream user publishes them, each confirmed (many at once)."""
    broker = RabbitBroker(url)
    await broker.connect()
    await broker.declare_queue(RabbitQueue(FASTSTREAM_QUEUE))
    for start in range(0, count, 500):
        await asyncio.gather(
            *(
                broker.publish({"n": n, "last": n == count - 1}, queue=FASTSTREAM_QUEUE)
                for n in range(start, min(count, start + 500))
            )
        )
    await broker.stop()


@contextlib.contextmanager
def celery_workers(run: Run, library: str, pool: str, concurrency: int, processes: int) -> Iterator[None]:
    with contextlib.ExitStack() as workers:
        for _ in range(processes):
            workers.enter_context(run.worker(library, pool=pool, concurrency=concurrency))
        yield


@contextlib.contextmanager
def as_typed(run: Run, library: str) -> Iterator[None]:
    """``celery -A app worker -c 2``: no pool named (Celery's prefork; ours, the consuming pool), and no log level
    (Celery's, warning)."""
    python = legacy_python() if library == "legacy" else sys.executable
    with run.worker(library, pool=None, concurrency=2, python=python, typed=True):
        yield


@contextlib.contextmanager
def faststream(run: Run) -> Iterator[None]:
    env = {"QUEUE": OURS_QUEUE, "PREFETCH": str(PREFETCH)}
    argv = [FASTSTREAM, "run", "faststream_app:app", "--workers", "2"]
    with run.process("faststream", argv, "waiting for messages", times=2, env=env):  # one line per process
        yield


@contextlib.contextmanager
def faststream_own(run: Run, workers: int = 2, env: dict[str, str] | None = None) -> Iterator[None]:
    """FastStream as its users run it (bench/apps/faststream_own.py), ``--workers N``."""
    env = {"QUEUE": FASTSTREAM_QUEUE, "PREFETCH": str(PREFETCH), **(env or {})}
    argv = [FASTSTREAM, "run", "faststream_own:app", "--workers", str(workers)]
    with run.process("faststream-own", argv, "waiting for messages", times=workers, env=env):
        yield


@contextlib.contextmanager
def raw_consumers(run: Run) -> Iterator[None]:
    env = {"QUEUE": OURS_QUEUE, "PREFETCH": str(PREFETCH)}
    argv = [sys.executable, str(APPS / "raw_consumer.py")]
    with run.process("raw-1", argv, "ready.", env=env), run.process("raw-2", argv, "ready.", env=env):
        yield


def drained(
    bench: Bench,
    size: Size,
    name: str,
    library: str,
    consumers: Callable[[Run], contextlib.AbstractContextManager[None]],
) -> float:
    """Events/s ``consumers`` handle of a backlog of ``size.drain`` waiting events of ``library``."""
    with bench.run(f"backlog-{name}") as run:
        fill(run, library, size.drain)
        every = max(1, size.drain // 40)
        run.extra_env = {"MARK_EVERY": str(every)}
        with consumers(run):
            marks = run.wait_marks(lambda marks: any(mark["last"] for mark in marks))
        return steady_throughput(marks, size.drain)


def backlog_side_by_side(bench: Bench, size: Size) -> list[Result]:
    rates: dict[str, list[float]] = defaultdict(list)
    for _ in range(size.repeats):
        for pool, concurrency, processes in SETUPS:
            for library in ("ours", "plain"):
                workers = functools.partial(
                    celery_workers, library=library, pool=pool, concurrency=concurrency, processes=processes
                )
                rates[f"{library} {pool}"].append(drained(bench, size, f"{library}-{pool}", library, workers))
        rates["faststream"].append(drained(bench, size, "faststream", "ours", faststream))
        rates["raw"].append(drained(bench, size, "raw", "ours", raw_consumers))
    rate = {name: median(values) for name, values in rates.items()}
    results = []
    for pool, concurrency, _ in SETUPS:
        ours, plain = rate[f"ours {pool}"], rate[f"plain {pool}"]
        setup = "two -P solo processes" if pool == "solo" else f"-P {pool} -c {concurrency}"
        recommended = pool == "solo"
        results.append(
            Result(
                f"handling {size.drain:,} waiting events with {setup}, side by side with FastStream",
                f"{ours:,.0f} events/s",
                f"FastStream 2 processes: {rate['faststream']:,.0f}/s ({ours / rate['faststream']:.2f}x); "
                f"raw py-amqp consumer 2 processes: {rate['raw']:,.0f}/s ({ours / rate['raw']:.2f}x); "
                f"plain Celery, same pool: {plain:,.0f}/s ({ours / plain:.2f}x)",
                ours / rate["faststream"],
                ">= 1.0x FastStream, >= 0.5x the raw consumer" if recommended else "reported",
                (ours >= rate["faststream"] and ours >= 0.5 * rate["raw"]) if recommended else None,
                {
                    f"ours ({setup})": ours,
                    "FastStream": rate["faststream"],
                    "raw consumer": rate["raw"],
                    f"plain Celery ({setup})": plain,
                },
                {name: rates[name] for name in (f"ours {pool}", f"plain {pool}", "faststream", "raw")},
            )
        )
    return results


def the_command_as_typed(bench: Bench, size: Size) -> Result:
    """``celery -A app worker -c 2`` as most Celery users type it, ours against plain Celery and 0.1.0 on the same
    command (Celery's prefork pool: ours, the consuming pool), and FastStream ``--workers 2``."""
    rates: dict[str, list[float]] = defaultdict(list)
    for _ in range(size.repeats):
        for library in ("ours", "plain", "legacy"):
            typed = functools.partial(as_typed, library=library)
            rates[library].append(drained(bench, size, f"typed-{library}", library, typed))
        prefork = functools.partial(celery_workers, library="ours", pool="prefork", concurrency=2, processes=1)
        rates["ours prefork"].append(drained(bench, size, "ours-prefork", "ours", prefork))
        rates["faststream"].append(drained(bench, size, "faststream", "ours", faststream))
        rates["faststream own"].append(drained(bench, size, "faststream-own", "faststream", faststream_own))
    rate = {name: median(values) for name, values in rates.items()}
    ours = rate["ours"]
    return Result(
        f"handling {size.drain:,} waiting events with `celery worker -c 2` as typed (no -P), side by side",
        f"{ours:,.0f} events/s",
        f"FastStream --workers 2: {rate['faststream']:,.0f}/s ({ours / rate['faststream']:.2f}x); "
        f"FastStream as its users run it (its publisher, format and queue): {rate['faststream own']:,.0f}/s "
        f"({ours / rate['faststream own']:.2f}x); "
        f"plain Celery, same command: {rate['plain']:,.0f}/s ({ours / rate['plain']:.2f}x); "
        f"0.1.0, same command: {rate['legacy']:,.0f}/s ({ours / rate['legacy']:.2f}x); "
        f"ours with -P prefork -c 2: {rate['ours prefork']:,.0f}/s",
        ours / rate["faststream"],
        ">= 1.2x FastStream, >= 1.5x plain Celery and 0.1.0",
        ours >= 1.2 * rate["faststream"] and ours >= 1.5 * max(rate["plain"], rate["legacy"]),
        {
            "ours (consuming pool)": ours,
            "FastStream": rate["faststream"],
            "FastStream, its own format": rate["faststream own"],
            "plain Celery (prefork)": rate["plain"],
            "0.1.0 (prefork)": rate["legacy"],
            "ours -P prefork": rate["ours prefork"],
        },
        dict(rates),
    )
