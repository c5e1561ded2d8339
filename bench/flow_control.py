"""Flow control over a fleet of workers: a rate limit's accuracy over 10 workers beside Celery's own
``rate_limit=`` on the same 10, concurrency limits (per handler and per key) while workers are killed, what a
limit far above a handler's speed costs, and a worker's memory with events waiting over their limit beside
Celery's rate-limited worker. Workers run with Celery's default prefetch (4), as its users run them."""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

from bench.harness import Bench, Run, median, rss_kb, throughput
from bench.scenarios import QUICK, Result, Size

#: Worker processes of the fleet scenarios (the issue's ten).
WORKERS = 10
#: Celery's default ``worker_prefetch_multiplier``.
PREFETCH = "4"
QUEUE = "bench:bench.limited"


@dataclass(frozen=True)
class Shape:
    """The flow-control scenarios' sizes: ``rate`` is ``count`` per ``window`` seconds, held for ``seconds``."""

    rate: str
    count: int
    window: int
    seconds: float
    waiting: int
    killing: float
    kill_every: float


FULL_SHAPE = Shape("600/m", 600, 60, 300, 100_000, 60, 10)
QUICK_SHAPE = Shape("4/s", 4, 1, 10, 1000, 12, 4)  # a rate Celery can write too


def shape_of(size: Size) -> Shape:
    return QUICK_SHAPE if size == QUICK else FULL_SHAPE


def limited_app(run: Run, **env: str):  # type: ignore[no-untyped-def]
    """A fresh import of bench/apps/limited.py bound to ``run``'s vhost with the limits ``env`` gives."""
    for name in ("RATE", "CONCURRENCY", "RUN_SECONDS"):
        os.environ.pop(name, None)
    os.environ.update({"BROKER_URL": run.url, "SERVICE": "bench", **env})
    import limited

    return importlib.reload(limited).app


@contextlib.contextmanager
def fleet(run: Run, app: str, count: int, env: dict[str, str]) -> Iterator[list]:  # type: ignore[type-arg]
    """``count`` solo workers of ``app``, started one after another, stopped together."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(run.worker(app, env=env, prefetch_multiplier=PREFETCH)) for _ in range(count)]


def busiest(starts: list[float], window: float) -> int:
    """The most starts in any ``window`` seconds."""
    return max((sum(1 for t in starts if first <= t < first + window) for first in starts), default=0)


def rate_accuracy(bench: Bench, size: Size) -> Result:
    """10 workers under one rate limit for ``shape.seconds``: no window holds more than the limit, and the fleet
    starts nearly all it allows; Celery's ``rate_limit=`` on the same 10 workers counts per worker."""
    shape = shape_of(size)
    allowed = shape.count * round(shape.seconds / shape.window)
    env = {"RATE": shape.rate}
    with bench.run("limits-rate") as run:
        app = limited_app(run, **env)
        app.declare_topology()
        with app.batch():
            for n in range(allowed * 3 // 2):  # a backlog that outlasts the measurement
                app.fire("bench.limited", kwargs={"n": n})
        app.close()
        with fleet(run, "limited", WORKERS, env):
            first = run.wait_marks(lambda marks: bool(marks), timeout=120)[0]["time"]
            time.sleep(max(0.0, first + shape.seconds - time.time()))
        starts = sorted(mark["time"] for mark in run.marks_read() if mark["time"] < first + shape.seconds)
    ours_busiest, total = busiest(starts, shape.window), len(starts)
    with bench.run("limits-celery-rate") as run:
        os.environ.update({"BROKER_URL": run.url, "RATE": shape.rate})
        import celery_limited

        plain = importlib.reload(celery_limited).app
        with plain.producer_or_acquire() as producer:
            for n in range(allowed):
                plain.send_task("bench.limited", (n,), producer=producer)
        plain.close()
        with fleet(run, "celery_limited", WORKERS, {"RATE": shape.rate}):
            first = run.wait_marks(lambda marks: bool(marks), timeout=120)[0]["time"]
            time.sleep(max(0.0, first + shape.window - time.time()))
        celery_busiest = busiest(sorted(mark["time"] for mark in run.marks_read()), shape.window)
    share = total / allowed
    return Result(
        f"rate limit {shape.rate} over {WORKERS} workers, {shape.seconds:.0f} s",
        f"at most {ours_busiest} started in any {shape.window} s; {total:,} in all ({share:.0%} of {allowed:,})",
        f"Celery's rate_limit='{shape.rate}' on the same {WORKERS} workers: {celery_busiest:,} in {shape.window} s "
        f"({celery_busiest / shape.count:.1f}x the limit)",
        share,
        f"<= {shape.count} in every {shape.window} s, >= 95% of the allowed",
        ours_busiest <= shape.count and share >= 0.95,
        {"ours (busiest window)": ours_busiest, "Celery (busiest window)": celery_busiest},
    )


def concurrency_under_kills(bench: Bench, size: Size) -> Result:
    """10 workers, ``concurrency=3`` on one handler and ``concurrency=1`` per key over 200 keys on another, one
    worker killed (SIGKILL) and replaced every ``shape.kill_every`` s: the most runs ever seen at once."""
    shape = shape_of(size)
    env = {"CONCURRENCY": "3", "RUN_SECONDS": "0.2"}
    killed: dict[int, float] = {}
    with bench.run("limits-kills") as run:
        app = limited_app(run, **env)
        app.declare_topology()
        with app.batch():
            for n in range(int(shape.killing * 20)):  # more than 3 runs of 0.2 s take in the time
                app.fire("bench.limited", kwargs={"n": n})
                app.fire("bench.per_key", kwargs={"n": n, "key": f"account-{n % 200}"})
        app.close()
        with contextlib.ExitStack() as stack:
            workers = [stack.enter_context(run.worker("limited", env=env, prefetch_multiplier=PREFETCH))
                       for _ in range(WORKERS)]  # fmt: skip
            ends = time.monotonic() + shape.killing
            while time.monotonic() < ends:
                time.sleep(shape.kill_every)
                victim = workers.pop(random.randrange(len(workers)))
                os.kill(victim.pid, signal.SIGKILL)  # mid-run, most likely: its lease goes with its connection
                killed[victim.pid] = time.time()
                workers.append(stack.enter_context(run.worker("limited", env=env, prefetch_multiplier=PREFETCH)))
            stopped = time.time()
        marks = run.marks_read()
    most = {handler: _most_at_once(marks, handler, killed, stopped) for handler in ("limited", "per_key")}
    return Result(
        f"concurrency limits over {WORKERS} workers, one killed every {shape.kill_every:.0f} s for "
        f"{shape.killing:.0f} s",
        f"at most {most['limited']['']} runs at once (concurrency=3); at most {max(most['per_key'].values())} per "
        f"key over {len(most['per_key'])} keys (concurrency=1 per key)",
        f"{len(killed)} workers killed mid-run",
        None,
        "<= 3 at once; <= 1 per key",
        most["limited"][""] <= 3 and max(most["per_key"].values()) <= 1,
    )


def _most_at_once(marks: list[dict], handler: str, killed: dict[int, float], stopped: float) -> dict[str, int]:
    """Per key (``""``: none), the most runs of ``handler`` that overlapped; a run whose process was killed ran
    until the kill, one still going when the scenario stopped until then."""
    runs: dict[tuple[int, int], dict] = {}
    for mark in marks:
        if mark["handler"] == handler:
            runs.setdefault((mark["pid"], mark["n"]), {"key": mark.get("key", "")})[mark["tag"]] = mark["time"]
    edges: dict[str, list[tuple[float, int]]] = {}
    for (pid, _), run in runs.items():
        if "start" not in run:
            continue
        end = run.get("end", killed.get(pid, stopped))
        edges.setdefault(run["key"], []).extend([(run["start"], 1), (end, -1)])
    most = {}
    for key, steps in edges.items():
        running = highest = 0
        for _, step in sorted(steps):  # at one instant an end (-1) sorts first: touching is not overlapping
            running += step
            highest = max(highest, running)
        most[key] = highest
    return most


def overhead(bench: Bench, size: Size) -> list[Result]:
    """One solo worker draining ``size.drain`` waiting events: a handler with a limit far above its speed
    (``concurrency=1000``; ``rate_limit="1000000/m"``) against the same handler with none."""
    limits = {"none": {}, "concurrency=1000": {"CONCURRENCY": "1000"}, "rate_limit='1000000/m'": {"RATE": "1000000/m"}}
    rates: dict[str, list[float]] = {label: [] for label in limits}
    for _ in range(size.repeats):
        for label, env in limits.items():
            env = {**env, "MARK_ENDS_ONLY": "1"}
            with bench.run("limits-overhead") as run:
                app = limited_app(run, **env)
                app.declare_topology()
                with app.batch():
                    for n in range(size.drain):
                        app.fire("bench.limited", kwargs={"n": n, "last": n == size.drain - 1})
                app.close()
                run.wait_depth(QUEUE, size.drain)
                with run.worker("limited", env=env, prefetch_multiplier=PREFETCH):
                    marks = run.wait_marks(lambda marks: any(mark["last"] for mark in marks))
                rates[label].append(throughput(marks, size.drain))
    unlimited = median(rates["none"])
    results = []
    for label in list(limits)[1:]:
        limited = median(rates[label])
        ratio = limited / unlimited
        results.append(
            Result(
                f"handling {size.drain:,} waiting events with {label}, far above the handler's speed, one solo worker",
                f"{limited:,.0f} events/s",
                f"the same handler without limits: {unlimited:,.0f}/s ({ratio:.2f}x)",
                ratio,
                ">= 0.95x",
                ratio >= 0.95,
                {"limited": limited, "no limit": unlimited},
                {label: rates[label], "none": rates["none"]},
            )
        )
    return results


def memory_while_over_limit(bench: Bench, size: Size) -> Result:
    """A worker's RSS with ``shape.waiting`` events of a handler at its limit waiting (another worker holds its one
    place for the whole time), against plain Celery holding as many under its ``rate_limit=``."""
    shape = shape_of(size)
    growth = {
        "ours": _growth(bench, shape, "limited", {"CONCURRENCY": "1", "RUN_SECONDS": "3600"}),
        "celery": _growth(bench, shape, "celery_limited", {"RATE": "1/h"}),
    }
    return Result(
        f"worker memory with {shape.waiting:,} events waiting over their handler's limit",
        f"+{growth['ours']:.1f} MB RSS",
        f"Celery's rate_limit='1/h': +{growth['celery']:.1f} MB",
        None,
        "<= idle + 5 MB",
        growth["ours"] <= 5,
        {"ours (MB)": growth["ours"], "Celery (MB)": growth["celery"]},
    )


def _growth(bench: Bench, shape: Shape, app_name: str, env: dict[str, str]) -> float:
    with bench.run(f"limits-memory-{app_name}") as run:
        if app_name == "limited":
            app = limited_app(run, **env)
            app.declare_topology()
            fire = lambda numbers: _fire(app, numbers)  # noqa: E731
        else:
            os.environ.update({"BROKER_URL": run.url, **env})
            import celery_limited

            app = importlib.reload(celery_limited).app
            fire = lambda numbers: _send(app, numbers)  # noqa: E731
        holder = contextlib.ExitStack()
        with holder:
            if app_name == "limited":  # a worker of its own holds the handler's one place from the first event
                holder.enter_context(run.worker(app_name, env=env, prefetch_multiplier=PREFETCH))
                fire(range(1))
                run.wait_marks(lambda marks: bool(marks), timeout=120)
            with run.worker(app_name, env=env, prefetch_multiplier=PREFETCH) as worker:
                fire(range(1, 1001))  # warm-up: its connections made, some events turned away
                time.sleep(5)
                idle = rss_kb(worker.pid)
                fire(range(1001, 1001 + shape.waiting))
                time.sleep(30)  # a measurement period: Celery's worker takes in what waits meanwhile
                grown = (rss_kb(worker.pid) - idle) / 1024
        app.close()
        return grown


def _fire(app, numbers: range) -> None:  # type: ignore[no-untyped-def]
    with app.batch():
        for n in numbers:
            app.fire("bench.limited", kwargs={"n": n})


def _send(app, numbers: range) -> None:  # type: ignore[no-untyped-def]
    with app.producer_or_acquire() as producer:
        for n in numbers:
            app.send_task("bench.limited", (n,), producer=producer)
