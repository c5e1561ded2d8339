"""Coroutines: firing with ``await event.fire_async(...)`` against FastStream's ``broker.publish`` (both aio-pika,
both waiting for the confirm), ``app.batch_async()`` against raw aio-pika with every confirm in flight, a
no-op coroutine handler drained beside the same no-op plain handler, handlers waiting on I/O drained by one
process against FastStream and Celery's gevent pool, and the memory of thousands of them waiting at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import median

import aio_pika
from faststream.rabbit import ExchangeType, RabbitBroker, RabbitExchange

from bench.handling import FASTSTREAM, OURS_QUEUE, drained, faststream_own, fill
from bench.harness import Bench, Run
from bench.scenarios import Result, Size, drain, ours_app


def fire_async_one_at_a_time(bench: Bench, size: Size) -> Result:
    """One event at a time from a coroutine, each confirmed before the next: ours vs FastStream 0.7."""
    with bench.run("fire-async") as run:
        app = ours_app(run)
        app.declare_topology()  # the event's queue exists: every publish is routed

        @app.event("bench.noop")
        def noop(n: int, last: bool = False) -> None:
            if n < 0:
                raise ValueError("n must be >= 0")

        exchange = RabbitExchange("events", type=ExchangeType.TOPIC, durable=True)

        async def rounds() -> tuple[list[float], list[float]]:
            broker = RabbitBroker(run.url)
            await broker.connect()

            async def ours_round() -> float:
                started = time.perf_counter()
                for n in range(size.fire_per_round):
                    await noop.fire_async(n)
                return size.fire_per_round / (time.perf_counter() - started)

            async def faststream_round() -> float:
                started = time.perf_counter()
                for n in range(size.fire_per_round):
                    await broker.publish(
                        {"n": n}, exchange=exchange, routing_key="bench.noop", persist=True, mandatory=True
                    )
                return size.fire_per_round / (time.perf_counter() - started)

            await ours_round(), await faststream_round()  # warm up both connections
            ours, theirs = [], []
            for _ in range(size.fire_rounds):  # alternate, so that noise hits both alike
                ours.append(await ours_round())
                theirs.append(await faststream_round())
            await broker.stop()
            await app.close_async()
            return ours, theirs

        ours, theirs = asyncio.run(rounds())
        app.close()
    ratio = median(a / b for a, b in zip(ours, theirs, strict=True))
    return Result(
        "firing from asyncio, one event at a time with its confirm",
        f"{median(ours):,.0f} events/s",
        f"FastStream broker.publish: {median(theirs):,.0f} msg/s",
        ratio,
        ">= 1.0x FastStream",
        ratio >= 1.0,
        {"ours": median(ours), "FastStream": median(theirs)},
        {"ours": ours, "FastStream": theirs},
    )


def fire_async_in_a_batch(bench: Bench, size: Size) -> Result:
    """``async with app.batch_async()`` against raw aio-pika publishing the same events, all in flight."""
    ours, raw = [], []
    for _ in range(size.repeats):
        with bench.run("batch-async") as run:
            app = ours_app(run)
            app.declare_topology()

            async def both(app=app) -> tuple[float, float]:  # type: ignore[no-untyped-def]
                started = time.perf_counter()
                async with app.batch_async():
                    for n in range(size.batch):
                        await app.fire_async("bench.noop", [n], {})
                mine = size.batch / (time.perf_counter() - started)
                await app.close_async()
                # The same events (each of its own id and time), built beforehand: only publishing is timed.
                messages = [app.event_message("bench.noop", [n], {}) for n in range(size.batch)]
                return mine, await raw_pipelined(run.url, messages)

            mine, theirs = asyncio.run(both())
            ours.append(mine)
            raw.append(theirs)
            app.close()
    ratio = median(a / b for a, b in zip(ours, raw, strict=True))
    return Result(
        f"async batch of {size.batch:,} events (confirms pipelined)",
        f"{median(ours):,.0f} events/s",
        f"raw aio-pika, all in flight: {median(raw):,.0f} msg/s",
        ratio,
        ">= 0.8x raw aio-pika",
        ratio >= 0.8,
        {"ours": median(ours), "raw aio-pika": median(raw)},
        {"ours": ours, "raw aio-pika": raw},
    )


async def raw_pipelined(url: str, messages: list) -> float:  # type: ignore[type-arg]
    """Messages/s of aio-pika publishing prebuilt events with every confirm awaited together."""
    import json

    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    exchange = await channel.get_exchange("events", ensure=False)
    bodies = [
        aio_pika.Message(
            json.dumps(message.body).encode(), headers=message.headers, content_type="application/json",
            content_encoding="utf-8", delivery_mode=2, message_id=message.message_id,
        )
        for message in messages
    ]  # fmt: skip
    started = time.perf_counter()
    await asyncio.gather(*(exchange.publish(body, "bench.noop", mandatory=True) for body in bodies))
    rate = len(messages) / (time.perf_counter() - started)
    await connection.close()
    return rate


def coroutine_handler_drain(bench: Bench, size: Size) -> Result:
    """A no-op ``async def`` handler against the same no-op plain handler, one solo worker each, alternating."""
    ours, plain = [], []
    for _ in range(size.repeats):
        ours.append(drain(bench, size, "ours", "solo", 1, worker_env={"ASYNC_NOOP": "1"}))
        plain.append(drain(bench, size, "ours", "solo", 1))
    ratio = median(a / b for a, b in zip(ours, plain, strict=True))
    return Result(
        f"drain of {size.drain:,} events, a no-op coroutine handler (solo)",
        f"{median(ours):,.0f} events/s",
        f"the same no-op plain handler: {median(plain):,.0f} events/s",
        ratio,
        ">= 0.9x the plain handler",
        ratio >= 0.9,
        {"coroutine": median(ours), "plain": median(plain)},
        {"coroutine": ours, "plain": plain},
    )


#: The wait of each I/O-bound handler (a 10 ms call to another service), and how many run at once.
IO_WAIT = "0.01"
IN_FLIGHT = 100
#: The benchmark service's worker consumes two queues (bench/apps/ours.py), and each holds its share of the
#: messages a worker of coroutine handlers keeps in hand (``amqp_events_async_concurrency``): twice the count puts
#: ``IN_FLIGHT`` on the handler's queue.
SHARES = 2


def io_bound_drain(bench: Bench, size: Size) -> Result:
    """Handlers that each wait 10 ms on I/O, a backlog drained by one process: our coroutine handler (-P solo,
    100 in flight; and the command as typed, one process) vs FastStream 0.7 (an async subscriber, prefetch 100)
    vs plain Celery -P gevent -c 100 (the same handler written as plain code, ``time.sleep`` made cooperative by
    gevent)."""
    env = {
        "IO_WAIT": IO_WAIT,
        "ASYNC_NOOP": "1",
        "ASYNC_CONCURRENCY": str(IN_FLIGHT * SHARES),
        "PREFETCH": str(IN_FLIGHT),
    }

    @contextlib.contextmanager
    def ours(run: Run) -> Iterator[None]:
        with run.worker("ours", env=env):
            yield

    @contextlib.contextmanager
    def ours_as_typed(run: Run) -> Iterator[None]:
        with run.worker("ours", pool=None, concurrency=1, env=env):  # celery worker -c 1: the consuming pool
            yield

    @contextlib.contextmanager
    def faststream_one(run: Run) -> Iterator[None]:
        argv = [FASTSTREAM, "run", "faststream_app:app", "--workers", "1"]
        with run.process("faststream", argv, "waiting for messages", env={**env, "QUEUE": OURS_QUEUE}):
            yield

    @contextlib.contextmanager
    def gevent(run: Run) -> Iterator[None]:
        with run.worker("plain", pool="gevent", concurrency=IN_FLIGHT, env=env):
            yield

    @contextlib.contextmanager
    def faststream_as_its_users_run_it(run: Run) -> Iterator[None]:
        with faststream_own(run, workers=1, env=env):
            yield

    rates: dict[str, list[float]] = {
        "ours": [],
        "ours as typed": [],
        "FastStream": [],
        "FastStream own": [],
        "Celery gevent": [],
    }
    for _ in range(size.repeats):  # interleaved, so that noise hits each alike
        rates["ours"].append(drained(bench, size, "io-ours", "ours", ours))
        rates["ours as typed"].append(drained(bench, size, "io-ours-typed", "ours", ours_as_typed))
        rates["FastStream"].append(drained(bench, size, "io-faststream", "ours", faststream_one))
        rates["FastStream own"].append(
            drained(bench, size, "io-faststream-own", "faststream", faststream_as_its_users_run_it)
        )
        rates["Celery gevent"].append(drained(bench, size, "io-gevent", "plain", gevent))
    rate = {name: median(values) for name, values in rates.items()}
    versus_faststream, versus_gevent = rate["ours"] / rate["FastStream"], rate["ours"] / rate["Celery gevent"]
    versus_own = rate["ours"] / rate["FastStream own"]
    return Result(
        f"drain of {size.drain:,} events whose handler waits 10 ms on I/O, one process, {IN_FLIGHT} in flight",
        f"{rate['ours']:,.0f} events/s",
        f"FastStream as its users run it (its publisher, format and queue): {rate['FastStream own']:,.0f}/s "
        f"({versus_own:.2f}x); FastStream on our queue and format: {rate['FastStream']:,.0f}/s "
        f"({versus_faststream:.2f}x); plain Celery -P gevent -c {IN_FLIGHT}: {rate['Celery gevent']:,.0f}/s "
        f"({versus_gevent:.2f}x); ours with `celery worker -c 1` as typed (the consuming pool): "
        f"{rate['ours as typed']:,.0f}/s",
        versus_own,
        ">= 1.2x FastStream as its users run it, >= 2x Celery gevent",
        versus_own >= 1.2 and versus_gevent >= 2.0,
        rate,
        rates,
    )


def waiting_memory(bench: Bench, size: Size) -> Result:
    """The memory of one worker process holding ``size.waiting`` handlers waiting on I/O at once: coroutines on
    our worker's loop vs greenlets of plain Celery -P gevent."""
    held = size.waiting
    ours = {"ASYNC_NOOP": "1", "ASYNC_CONCURRENCY": str(held * SHARES), "HOLD": "600", "MARK_ALL": "1"}
    rss: dict[str, tuple[float, float]] = {}
    for name, library, pool, env in (
        ("ours", "ours", "solo", ours),
        ("Celery gevent", "plain", "gevent", {"HOLD": "600", "MARK_ALL": "1"}),
    ):
        with bench.run(f"memory-{library}") as run:
            run.plain_queue_type = "quorum"  # as fill() declares it
            concurrency = held if pool == "gevent" else 1
            # AMQP's prefetch count is 16 bits: gevent's -c 5000 times 16 would not fit.
            with run.worker(library, pool=pool, concurrency=concurrency, env=env, prefetch_multiplier="1") as worker:
                idle = resident_mb(worker.pid)
                fill(run, library, held, wait=False)
                run.wait_marks(lambda marks: len(marks) >= held, timeout=300)
                rss[name] = (idle, resident_mb(worker.pid))
    per_ours, per_gevent = ((loaded - idle) * 1024 / held for idle, loaded in (rss["ours"], rss["Celery gevent"]))
    return Result(
        f"memory of one worker with {held:,} handlers waiting on I/O at once",
        f"{rss['ours'][1]:,.0f} MB RSS ({per_ours:.1f} KB each)",
        f"plain Celery -P gevent -c {held:,}: {rss['Celery gevent'][1]:,.0f} MB ({per_gevent:.1f} KB each)",
        rss["ours"][1] / rss["Celery gevent"][1],
        "reported",
        None,
        {"ours (MB)": rss["ours"][1], "Celery gevent (MB)": rss["Celery gevent"][1]},
    )


def resident_mb(pid: int) -> float:
    """A process's resident memory (``VmRSS``), in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024
