"""Coroutines: firing with ``await event.fire_async(...)`` against FastStream's ``broker.publish`` (both aio-pika,
both waiting for the confirm), ``app.batch_async()`` against raw aio-pika with every confirm in flight, and a
no-op coroutine handler drained beside the same no-op plain handler."""

from __future__ import annotations

import asyncio
import time
from statistics import median

import aio_pika
from faststream.rabbit import ExchangeType, RabbitBroker, RabbitExchange

from bench.harness import Bench
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
    )
