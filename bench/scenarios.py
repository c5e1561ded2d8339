"""The benchmark scenarios. Each runs its baselines in the same run and returns :class:`Result` rows."""

from __future__ import annotations

import importlib
import os
import sys
import time
from dataclasses import dataclass, field

from kombu import Connection, Producer

from bench.harness import (
    APPS,
    OLDEST_CELERY_LINE,
    Bench,
    Run,
    celery_line_python,
    celery_version,
    legacy,
    legacy_python,
    median,
    percentile,
    rss_kb,
    throughput,
)

sys.path.insert(0, str(APPS))


@dataclass
class Size:
    """How big each scenario is: ``quick`` proves the suite runs; ``full`` measures."""

    fire_rounds: int
    fire_per_round: int
    batch: int
    drain: int
    fanout: int
    waiting: int
    warm_up: int
    background: int
    delayed_per_kind: int
    repeats: int
    latency_samples: int
    #: Messages in an archive the console shows (the default archive's bound).
    archived: int = 10_000
    #: Services whose archives the console shows (bench/console.py).
    console_services: int = 10
    #: Services of 50 handlers each in the fleet declared on a cluster (bench/fleet.py).
    fleet: int = 40


QUICK = Size(3, 150, 2000, 2000, 1000, 500, 200, 1000, 3, 1, 30, archived=1000, fleet=2, console_services=2)
FULL = Size(9, 1000, 20000, 20000, 10000, 5000, 1000, 10000, 20, 3, 200)


@dataclass
class Result:
    scenario: str
    ours: str
    baselines: str
    ratio: float | None
    target: str
    met: bool | None
    #: Numbers for the chart: label -> value.
    values: dict[str, float] = field(default_factory=dict)
    #: Each round's figure, by contender (the values are their medians).
    rounds: dict[str, list[float]] = field(default_factory=dict)


def ours_app(run: Run, service: str = "bench"):  # type: ignore[no-untyped-def]
    """A fresh import of bench/apps/ours.py bound to ``run``'s vhost (the module reads BROKER_URL)."""
    os.environ.update({"BROKER_URL": run.url, "SERVICE": service})
    import ours

    return importlib.reload(ours).app


def plain_app(run: Run):  # type: ignore[no-untyped-def]
    """A fresh import of bench/apps/plain.py bound to ``run``'s vhost and plain queue type."""
    os.environ.update({"BROKER_URL": run.url, "PLAIN_QUEUE_TYPE": run.plain_queue_type})
    import plain

    return importlib.reload(plain).app


def fire_one_at_a_time(bench: Bench, size: Size) -> Result:
    """Firing with a confirm per event, against raw kombu publishing the same message with a confirm."""
    with bench.run("fire") as run:
        app = ours_app(run)
        app.declare_topology()  # the event's queue exists: every publish is routed

        @app.event("bench.noop")
        def noop(n: int, last: bool = False) -> None:
            if n < 0:
                raise ValueError("n must be >= 0")

        template = app.event_message("bench.noop", [0], {})
        connection = Connection(run.url, transport_options={"confirm_publish": True})
        producer = Producer(connection.default_channel)

        def ours_round() -> float:
            started = time.perf_counter()
            for n in range(size.fire_per_round):
                noop(n)
            return size.fire_per_round / (time.perf_counter() - started)

        def raw_round() -> float:
            started = time.perf_counter()
            for _ in range(size.fire_per_round):
                producer.publish(
                    template.body, exchange="events", routing_key="bench.noop", headers=template.headers,
                    serializer="json", delivery_mode=2, mandatory=True, message_id=template.message_id,
                )  # fmt: skip
            return size.fire_per_round / (time.perf_counter() - started)

        ours_round(), raw_round()  # warm up both connections
        ours_rates, raw_rates, ratios = [], [], []
        for _ in range(size.fire_rounds):  # alternate, so that noise hits both alike
            ours_rates.append(ours_round())
            raw_rates.append(raw_round())
            ratios.append(ours_rates[-1] / raw_rates[-1])
        connection.release()
        app.close()
    ratio = median(ratios)
    return Result(
        "firing one event at a time, with publisher confirm",
        f"{median(ours_rates):,.0f} events/s",
        f"raw kombu publish + confirm: {median(raw_rates):,.0f} msg/s",
        ratio,
        ">= 1.0x raw kombu",
        ratio >= 1.0,
        {"ours": median(ours_rates), "raw kombu": median(raw_rates)},
        {"ours": ours_rates, "raw kombu": raw_rates},
    )


def raw_pipelined(url: str, messages: list, window: int = 2000) -> float:  # type: ignore[type-arg]
    """Messages/s of kombu publishing ``messages`` (prebuilt events) on a channel in confirm mode, up to
    ``window`` in flight, their confirms read as they stream in: the raw client's batch."""
    with Connection(url, transport_options={"confirm_publish": False}) as connection:
        channel = connection.channel()
        channel.confirm_select()
        confirmed = [0]
        channel.events["basic_ack"].add(lambda tag, multiple: confirmed.__setitem__(0, max(confirmed[0], tag)))
        producer = Producer(channel)
        started = time.perf_counter()
        for sent, message in enumerate(messages, 1):
            producer.publish(
                message.body, exchange=message.exchange, routing_key=message.routing_key, headers=message.headers,
                serializer="json", delivery_mode=2, mandatory=True, message_id=message.message_id,
            )  # fmt: skip
            while sent - confirmed[0] >= window:
                connection.drain_events(timeout=10)
        while confirmed[0] < len(messages):
            connection.drain_events(timeout=10)
        return len(messages) / (time.perf_counter() - started)


def fire_in_a_batch(bench: Bench, size: Size) -> Result:
    """``app.batch()`` (pipelined confirms) against raw kombu pipelining the same events, and 0.1.0."""
    ours_rates, raw_rates, legacy_rates = [], [], []
    for _ in range(size.repeats):
        with bench.run("batch") as run:
            app = ours_app(run)
            app.declare_topology()
            started = time.perf_counter()
            with app.batch():
                for n in range(size.batch):
                    app.fire("bench.noop", [n], {})
            ours_rates.append(size.batch / (time.perf_counter() - started))
            # The same events (each of its own id and time), built beforehand: only publishing is timed.
            messages = [app.event_message("bench.noop", [n], {}) for n in range(size.batch)]
            raw_rates.append(raw_pipelined(run.url, messages))
            app.close()
        with bench.run("batch-legacy") as run:
            with run.worker("legacy", python=legacy_python()):
                pass  # 0.1.0's worker declares its queues; then fire with nothing consuming
            # 0.1.0 fires one confirmed event at a time: a quarter of the events measures its rate.
            legacy_rates.append(legacy(run, "legacy_fire.py", str(size.batch // 4))["rate"])
    ours, raw, legacy_rate = median(ours_rates), median(raw_rates), median(legacy_rates)
    return Result(
        "firing a batch of events (app.batch(), pipelined confirms)",
        f"{ours:,.0f} events/s",
        f"raw kombu, pipelined confirms: {raw:,.0f} msg/s; "
        f"0.1.0: {legacy_rate:,.0f} events/s ({ours / legacy_rate:.1f}x)",
        ours / raw,
        ">= 0.8x raw pipelined publishing",
        ours / raw >= 0.8,
        {"ours (batch)": ours, "raw kombu, pipelined": raw, "0.1.0": legacy_rate},
        {"ours (batch)": ours_rates, "raw kombu, pipelined": raw_rates, "0.1.0": legacy_rates},
    )


def drain(
    bench: Bench,
    size: Size,
    library: str,
    pool: str,
    concurrency: int,
    python: str = sys.executable,
    worker_env: dict[str, str] | None = None,
    wire_format: str = "celery",
) -> float:
    """Events/s one worker handles, ``size.drain`` no-op events already waiting in its queue.

    ``python``: the interpreter the worker runs with (another Celery line's virtualenv); ``worker_env``:
    more environment for the worker; ``wire_format``: how ours are fired ("cloudevents": by name).
    """
    with bench.run(f"drain-{library}") as run:
        if library == "ours":
            app = ours_app(run)
            app.declare_topology()
            with app.batch():
                for n in range(size.drain):
                    app.fire("bench.noop", kwargs={"n": n, "last": n == size.drain - 1}, wire_format=wire_format)
            app.close()
            queue = "bench:bench.noop"
        elif library in ("plain", "plain-quorum"):
            # plain-quorum: the same plain Celery on a quorum queue, to show what the queue type costs
            run.plain_queue_type = "quorum" if library == "plain-quorum" else "classic"
            plain = plain_app(run)
            plain.conf.broker_transport_options = {"confirm_publish": False}  # filling is not measured
            with plain.producer_or_acquire() as producer:
                for n in range(size.drain):
                    plain.send_task("bench.noop", (n,), {"last": n == size.drain - 1}, producer=producer)
            plain.close()
            queue = "plain"
        else:
            python = legacy_python()
            with run.worker("legacy", python=python):
                pass  # declare 0.1.0's queues
            legacy(run, "legacy_fire.py", str(size.drain), "--last")
            queue = "legacy.bench.noop"
        run.wait_depth(queue, size.drain)
        with run.worker(library.split("-")[0], pool=pool, concurrency=concurrency, python=python, env=worker_env):
            marks = run.wait_marks(lambda marks: any(mark["last"] for mark in marks))
        return throughput(marks, size.drain)


def end_to_end(bench: Bench, size: Size, pool: str, concurrency: int) -> Result:
    rates: dict[str, list[float]] = {"ours": [], "plain": [], "legacy": [], "plain-quorum": []}
    for _ in range(size.repeats):
        for library in rates:
            rates[library].append(drain(bench, size, library, pool, concurrency))
    ours, plain, legacy_rate, quorum = (median(rates[name]) for name in rates)
    ratio = ours / plain
    return Result(
        f"handling {size.drain:,} waiting events, one service, -P {pool} -c {concurrency}",
        f"{ours:,.0f} events/s",
        f"plain Celery: {plain:,.0f}/s ({ratio:.2f}x); 0.1.0: {legacy_rate:,.0f}/s ({ours / legacy_rate:.2f}x); "
        f"plain Celery on a quorum queue: {quorum:,.0f}/s ({ours / quorum:.2f}x)",
        ratio,
        ">= 1.0x plain Celery and 0.1.0",
        ratio >= 1.0 and ours >= legacy_rate,
        {"ours": ours, "plain Celery": plain, "0.1.0": legacy_rate, "plain Celery, quorum queue": quorum},
        rates,
    )


def solo_on_each_celery_line(bench: Bench, size: Size) -> Result:
    """The solo pool on the oldest and the newest supported Celery line, each against plain Celery of that line.

    Celery queues a solo worker's acks for the event loop's next turn (``call_soon``, or ``call_soon_ack``
    in 5.7) and the loop may first sleep in ``poll()`` for 10 s: the library sends them at once on every
    line. A stall shows here as a rate far below plain Celery's.
    """
    rates: dict[str, tuple[float, float]] = {}
    for python in (celery_line_python(OLDEST_CELERY_LINE), sys.executable):
        version = celery_version(python)
        ours = median([drain(bench, size, "ours", "solo", 1, python) for _ in range(size.repeats)])
        plain = median([drain(bench, size, "plain-quorum", "solo", 1, python) for _ in range(size.repeats)])
        rates[version] = (ours, plain)
    worst = min(ours / plain for ours, plain in rates.values())
    return Result(
        f"handling {size.drain:,} waiting events with -P solo, on each supported Celery line",
        "; ".join(f"Celery {version}: {ours:,.0f}/s" for version, (ours, _) in rates.items()),
        "; ".join(
            f"plain Celery {version} on a quorum queue: {plain:,.0f}/s ({ours / plain:.2f}x)"
            for version, (ours, plain) in rates.items()
        ),
        worst,
        ">= 0.8x plain Celery of the same line (no stall)",
        worst >= 0.8,
        {f"ours, Celery {version}": ours for version, (ours, _) in rates.items()},
    )


def fan_out(bench: Bench, size: Size, one_service_rate: float) -> Result:
    """One event type, three services each with its own worker: deliveries per second."""
    with bench.run("fanout") as run:
        services = ["alpha", "beta", "gamma"]
        apps = [ours_app(run, service) for service in services]
        for app in apps:
            app.declare_topology()
        with apps[0].batch():
            for n in range(size.fanout):
                apps[0].fire("bench.noop", [n], {"last": n == size.fanout - 1})
        for app in apps:
            app.close()
        for service in services:
            run.wait_depth(f"{service}:bench.noop", size.fanout)
        with (
            run.worker("ours", service="alpha"),
            run.worker("ours", service="beta"),
            run.worker("ours", service="gamma"),
        ):
            marks = run.wait_marks(lambda marks: sum(mark["last"] for mark in marks) == 3)
    first = min(mark["time"] for mark in marks if mark["n"] == 0)
    last = max(mark["time"] for mark in marks if mark["last"])
    deliveries = 3 * size.fanout / (last - first)
    ratio = deliveries / one_service_rate
    return Result(
        "fan-out: one event type, 3 services (a solo worker each)",
        f"{deliveries:,.0f} deliveries/s",
        f"1 service: {one_service_rate:,.0f}/s",
        ratio,
        "reported (2 CPU cores for 3 workers and the broker)",
        None,
        {"3 services": deliveries, "1 service": one_service_rate},
    )


def memory_while_waiting(bench: Bench, size: Size) -> Result:
    """Worker RSS with ``size.waiting`` events waiting for their retry, against plain Celery's countdown."""
    growth = {}
    # "Idle" is measured once some events already wait: by then the worker made its connections and
    # caches, and its heap holds the garbage cycles failures leave for Python's collector (a plateau
    # of ~30 MB after a few hundred retries, with either library), so what remains is what waiting costs.
    warm_up = size.warm_up
    for library in ("ours", "plain"):
        with bench.run(f"memory-{library}") as run, run.worker(library) as worker:
            fire = _fire_waiting_ours if library == "ours" else _fire_waiting_plain
            fire(run, range(warm_up))
            run.wait_marks(lambda marks: len(marks) >= warm_up)
            time.sleep(2)
            idle = rss_kb(worker.pid)
            fire(run, range(warm_up, warm_up + size.waiting))
            run.wait_marks(lambda marks: len(marks) >= warm_up + size.waiting)
            time.sleep(2)
            growth[library] = (rss_kb(worker.pid) - idle) / 1024
    return Result(
        f"worker memory with {size.waiting:,} events waiting 600 s for their retry",
        f"+{growth['ours']:.1f} MB RSS",
        f"plain Celery retry(countdown=600): +{growth['plain']:.1f} MB",
        None,
        "<= idle + 5 MB",
        growth["ours"] <= 5,
        {"ours (MB)": growth["ours"], "plain Celery (MB)": growth["plain"]},
    )


def _fire_waiting_ours(run: Run, numbers: range) -> None:
    app = ours_app(run)
    with app.batch():
        for n in numbers:
            app.fire("bench.wait", [n, 600], {})
    app.close()


def _fire_waiting_plain(run: Run, numbers: range) -> None:
    app = plain_app(run)
    with app.producer_or_acquire() as producer:
        for n in numbers:
            app.send_task("bench.wait", (n, 600), producer=producer)
    app.close()


def retry_delay_accuracy(bench: Bench, size: Size) -> Result:
    """Lateness of 1 s and 16 s retries while ``size.background`` other events flow; never early."""
    with bench.run("accuracy") as run, run.worker("ours", pool="prefork", concurrency=2):
        app = ours_app(run)
        every = size.background // (2 * size.delayed_per_kind)
        delays = {}  # event number -> its retry delay, 1 s and 16 s alternating
        with app.batch():
            for n in range(size.background):
                app.fire("bench.noop", [n + 1], {})
                if n % every == 0:
                    delays[n] = 1 if len(delays) % 2 else 16
                    app.fire("bench.wait", [n, delays[n]], {})
        app.close()
        wanted = 2 * size.delayed_per_kind

        def done(marks: list[dict]) -> bool:
            return sum(1 for mark in marks if mark["attempt"] == 2) >= wanted

        marks = run.wait_marks(done, timeout=120)
    attempts: dict[int, dict[int, float]] = {}
    for mark in marks:
        if mark["attempt"]:
            attempts.setdefault(mark["n"], {})[mark["attempt"]] = mark["time"]
    lateness: dict[int, list[float]] = {1: [], 16: []}
    for n, times in attempts.items():
        if 1 in times and 2 in times:
            lateness[delays[n]].append(times[2] - times[1] - delays[n])
    never_early = all(value >= 0 for values in lateness.values() for value in values)
    summary = "; ".join(
        f"{delay} s: p50 {percentile(values, 0.5) * 1000:.0f} ms, p99 {percentile(values, 0.99) * 1000:.0f} ms, "
        f"max {max(values) * 1000:.0f} ms (n={len(values)})"
        for delay, values in lateness.items()
        if values
    )
    return Result(
        f"retry delay accuracy while {size.background:,} other events flow",
        summary,
        "-",
        None,
        "never early; report p50/p99 lateness",
        never_early,
        {f"{delay} s p99 (ms)": percentile(values, 0.99) * 1000 for delay, values in lateness.items() if values},
    )
