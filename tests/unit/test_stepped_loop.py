"""The coroutine handlers' loop stepped by kombu's hub: the real hub, driven in a thread of its own, no broker."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kombu.asynchronous import Hub

from amqp_events.celery.coroutine_loop import CoroutineRunner
from amqp_events.celery.loop import LoopWaker
from amqp_events.coroutines import complete

#: Seconds any one wait here takes at most (a lost wake-up hangs until then, and fails).
BOUND = 20


@dataclass
class Driven:
    runner: CoroutineRunner
    hub: Hub
    thread: threading.Thread
    stop: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    driver: list[int] = field(default_factory=list)


@contextmanager
def driven_by_a_hub(concurrency: int = 100) -> Iterator[Driven]:
    """A runner whose loop a kombu hub steps in a thread, as a worker's consumer does; when the hub stops, that
    thread finishes the runner (as the consumer does at a warm shutdown)."""
    hub = Hub()
    waker = LoopWaker(hub)
    runner = CoroutineRunner(hub, waker.wake, concurrency, shutdown_timeout=BOUND)
    hub.on_tick.add(runner.before_poll)
    driven: Driven

    def drive() -> None:
        driven.driver.append(threading.get_ident())
        runner.loop_started()  # as the consumer does when Celery starts its event loop
        loop = hub.create_loop()
        while not driven.stop.is_set():
            next(loop)
        runner.finish()
        driven.finished.set()

    driven = Driven(runner, hub, threading.Thread(target=drive, name="hub"))
    driven.thread.start()
    try:
        yield driven
    finally:
        driven.stop.set()
        waker.wake()
        driven.thread.join(BOUND)
        runner.stop()
        waker.close()
        hub.close()


def in_another_thread(function: Any, *args: Any) -> Any:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(function, *args).result(timeout=BOUND)


def test_a_coroutine_waiting_on_a_timer_alone_is_woken_by_the_hub_s_timer():
    with driven_by_a_hub() as driven:
        assert in_another_thread(driven.runner.worker_loop.run, asyncio.sleep(0.05, result="slept")) == "slept"


def test_calls_from_many_threads_at_once_are_each_stepped_while_the_hub_is_idle_otherwise():
    """A call from another thread while the loop steps must not lose its wake-up: each of them returns."""

    async def echo(n: int) -> int:
        await asyncio.sleep(0)
        return n

    with driven_by_a_hub() as driven:
        run = driven.runner.worker_loop.run

        def calls(first: int) -> list[int]:
            return [run(echo(n)) for n in range(first, first + 300)]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = [future.result(timeout=BOUND) for future in [pool.submit(calls, k * 300) for k in range(4)]]
        assert sorted(n for chunk in results for n in chunk) == list(range(1200))


def test_pipelines_run_in_the_hub_s_thread_wait_together_and_finish_when_the_hub_stops():
    done: list[tuple[int, int]] = []
    all_started = threading.Event()
    started: list[int] = []

    def pipeline(n: int) -> None:
        started.append(n)
        if len(started) == 50:
            all_started.set()
        complete(asyncio.sleep(0.3))  # each in flight at once, in the hub's thread
        done.append((n, threading.get_ident()))

    with driven_by_a_hub(concurrency=50) as driven:
        for n in range(50):
            driven.runner.submit(pipeline, (n,))
        assert all_started.wait(BOUND)
        driven.stop.set()  # the hub stops while they wait: they finish in its thread all the same
        assert driven.finished.wait(BOUND)
        assert sorted(n for n, _ in done) == list(range(50))
        assert {thread for _, thread in done} == set(driven.driver)
        # Handed over: the loop still runs for whoever waits on it.
        assert in_another_thread(driven.runner.worker_loop.run, asyncio.sleep(0, result=1)) == 1
