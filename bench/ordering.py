"""Ordered handling (``ordered_by``) beside unordered, in one run: the same backlog, the same worker.

A worker of the ``ordered`` app (``-P threads -c 4``, one process: ordered
partitions go to one worker at a time) drains the same number of waiting
no-op events, fired with 1, 10 or 10,000 distinct keys, once through an
ordered handler and once through an unordered one. With one key the ordered
events run one at a time by design; with many keys they run alongside.
"""

from __future__ import annotations

import importlib
import os

from bench.harness import Bench, Run, median, steady_throughput
from bench.scenarios import Result, Size

KEYS = (1, 10, 10_000)
POOL, CONCURRENCY = "threads", 4


def fill(run: Run, event: str, count: int, keys: int) -> None:
    os.environ.update({"BROKER_URL": run.url, "SERVICE": "bench"})
    import ordered

    app = importlib.reload(ordered).app
    app.declare_topology()
    with app.batch():
        for n in range(count):
            key = f"k{n % keys}"
            app.fire(event, kwargs={"n": n, "key": key, "last": n == count - 1}, key=key)
    app.close()


def drained(bench: Bench, size: Size, event: str, keys: int) -> float:
    with bench.run(f"{event}-{keys}-keys") as run:
        fill(run, event, size.drain, keys)
        run.extra_env = {"MARK_EVERY": str(max(1, size.drain // 40))}
        with run.worker("ordered", pool=POOL, concurrency=CONCURRENCY):
            marks = run.wait_marks(lambda marks: _all_marked(marks, size.drain))
        return steady_throughput(marks, size.drain)


def _all_marked(marks: list[dict], count: int) -> bool:
    every = max(1, count // 40)
    wanted = set(range(0, count, every)) | {count - 1}
    return wanted <= {mark["n"] for mark in marks}


def ordered_beside_unordered(bench: Bench, size: Size) -> list[Result]:
    results = []
    for keys in KEYS:
        ordered = median([drained(bench, size, "bench.ordered", keys) for _ in range(size.repeats)])
        unordered = median([drained(bench, size, "bench.unordered", keys) for _ in range(size.repeats)])
        target = keys == 10_000
        results.append(
            Result(
                f"handling {size.drain:,} waiting events of {keys:,} key(s) in order (-P {POOL} -c {CONCURRENCY})",
                f"{ordered:,.0f} events/s",
                f"unordered, same worker: {unordered:,.0f}/s ({ordered / unordered:.2f}x)",
                ordered / unordered,
                ">= 0.7x unordered" if target else "reported",
                ordered >= 0.7 * unordered if target else None,
                {f"ordered, {keys:,} keys": ordered, f"unordered, {keys:,} keys": unordered},
            )
        )
    return results
