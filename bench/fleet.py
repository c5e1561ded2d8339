"""Queue layouts at fleet scale: a fleet's quorum queues on a three-node cluster, one service with 50 handlers
draining, and a slow handler beside 49 fast ones in one queue (per_service against per_handler, the baseline)."""

from __future__ import annotations

import os
import time
import urllib.parse
from dataclasses import replace

from kombu import Connection

from amqp_events.local.cluster import LocalCluster
from amqp_events.settings import Settings
from amqp_events.topology import service_topology
from amqp_events.topology.sizing import quorum_queues
from amqp_events.transport.declare import declare_topology
from bench.harness import Bench, Run, median, percentile, rss_kb
from bench.scenarios import Result, Size

LAYOUTS = ("per_handler", "per_service")
HANDLERS = 50


def fleet_on_a_cluster(bench: Bench, cluster: LocalCluster, size: Size) -> list[Result]:
    """``size.fleet`` services of 50 handlers declared in each layout: quorum queues, memory per node, and one
    node's restart until every queue has all its members back."""
    figures: dict[str, dict[str, float]] = {}
    for layout in ("per_service", "per_handler"):  # the small one first: a node keeps the memory of deleted queues
        with bench.run(f"fleet-{layout}", cluster) as run:
            before = [rss_kb(node.beam_pid()) for node in cluster.nodes]
            settings = replace(Settings(), queue_layout=layout)
            events = [f"fleet.e{index:02d}" for index in range(HANDLERS)]
            with Connection(run.url) as connection:
                for service in range(size.fleet):
                    declare_topology(connection, service_topology(f"fleet{service:02d}", events, settings))
            queues = _wait_replicated(cluster, run.vhost, 3)
            grown = [rss_kb(node.beam_pid()) - was for node, was in zip(cluster.nodes, before, strict=True)]
            cluster.kill(1)  # as a crash (a graceful stop first takes a while more, whatever the layout)
            started = time.monotonic()
            cluster.nodes[1].start(600)
            booted = time.monotonic() - started
            cluster.wait_until_running(600)
            _wait_replicated(cluster, run.vhost, 3, timeout=600)
            figures[layout] = {
                "queues": queues,
                "memory": median([kb / 1024 for kb in grown]),
                "restart": time.monotonic() - started,
                "boot": booted,
            }
    fleet = f"{size.fleet} services x {HANDLERS} handlers on a 3-node cluster"
    ours, theirs = figures["per_service"], figures["per_handler"]
    booted = f"accepting AMQP after {ours['boot']:.1f} s", f"accepting AMQP after {theirs['boot']:.1f} s"
    return [
        _side_by_side(f"quorum queues of a fleet ({fleet})", figures, "queues", "{:,.0f}", "<= 0.1x"),
        _side_by_side(
            f"memory per node for those queues (median node, MB resident) ({fleet})",
            figures, "memory", "{:,.0f} MB", "<= 0.1x",
        ),
        _side_by_side(
            f"a node killed, then started until every queue has its 3 members back ({fleet})",
            figures, "restart", "{:.1f} s", ">= 3x faster", booted,
        ),
    ]  # fmt: skip


def _side_by_side(
    title: str,
    figures: dict[str, dict[str, float]],
    key: str,
    shown: str,
    target: str,
    more: tuple[str, str] = ("", ""),
) -> Result:
    """A figure that per_service must bring to a tenth of per_handler's (or, for a time, a third)."""
    ours, theirs = figures["per_service"][key], figures["per_handler"][key]
    ratio, met = (theirs / ours, theirs >= 3 * ours) if "faster" in target else (ours / theirs, ours <= theirs / 10)
    return Result(
        title,
        shown.format(ours) + f" (per_service{'; ' + more[0] if more[0] else ''})",
        "per_handler: " + shown.format(theirs) + (f" ({more[1]})" if more[1] else ""),
        ratio,
        target,
        met,
        {"per_service": ours, "per_handler": theirs},
    )


def _wait_replicated(cluster: LocalCluster, vhost: str, members: int, timeout: float = 300) -> int:
    """Wait until every quorum queue of ``vhost`` has ``members`` members online and a leader; returns how many."""
    deadline = time.monotonic() + timeout
    path = f"/api/queues/{urllib.parse.quote(vhost, safe='')}?columns=name,type,members,online,leader"
    while True:
        try:
            queues = cluster.management.request("GET", path)
        except OSError:  # the node that answered went down
            queues = None
        if queues is not None and all(
            len(queue.get("online") or []) >= members and queue.get("leader")
            for queue in queues
            if queue.get("type") == "quorum"
        ):
            return quorum_queues(queues)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the quorum queues of {vhost} did not all get {members} members online")
        time.sleep(0.5)


def fifty_handlers_drain(bench: Bench, size: Size) -> Result:
    """One solo worker draining a backlog spread over a service's 50 handlers, in each layout."""
    rates: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for _ in range(size.repeats):
        for layout in LAYOUTS:
            with bench.run(f"fifty-{layout}") as run:
                _fill(run, layout, size.drain)
                with run.worker("fleet", env=_env(layout)):
                    marks = run.wait_marks(lambda marks: len(marks) >= size.drain, timeout=600)
                times = sorted(mark["time"] for mark in marks)
                rates[layout].append(size.drain / (times[-1] - times[0]))
    ours, theirs = median(rates["per_service"]), median(rates["per_handler"])
    return Result(
        f"one solo worker draining {size.drain:,} waiting events over a service's {HANDLERS} handlers",
        f"{ours:,.0f} events/s (per_service)",
        f"per_handler: {theirs:,.0f}/s",
        ours / theirs,
        ">= 1.0x",
        ours >= theirs,
        {"per_service": ours, "per_handler": theirs},
    )


def slow_beside_fast(bench: Bench, size: Size, rate: float = 100.0) -> Result:
    """A handler taking 100 ms beside 49 fast ones, events fired at ``rate`` per second round the 50 handlers,
    one solo worker: how long the fast handlers' events waited from fire to handling (p50, p99)."""
    waits: dict[str, list[float]] = {}
    count = size.drain // 10
    for layout in LAYOUTS:
        with bench.run(f"slow-{layout}") as run:
            app = _app(run, layout)
            app.declare_topology()
            with run.worker("fleet", env={**_env(layout), "SLOW_MS": "100"}):
                started = time.monotonic()
                for n in range(count):
                    app.fire(f"fleet.e{n % HANDLERS:02d}", [n, time.time()], {})
                    time.sleep(max(0.0, started + (n + 1) / rate - time.monotonic()))
                marks = run.wait_marks(lambda marks: len(marks) >= count, timeout=600)
            app.close()
        waits[layout] = [mark["time"] - mark["fired_at"] for mark in marks if mark["handler"] != 0]
    ours, theirs = waits["per_service"], waits["per_handler"]
    p50, p99 = percentile(ours, 0.5) * 1000, percentile(ours, 0.99) * 1000
    base50, base99 = percentile(theirs, 0.5) * 1000, percentile(theirs, 0.99) * 1000
    return Result(
        f"fast handlers' wait beside a 100 ms one, {count:,} events at {rate:.0f}/s round 50 handlers, solo worker",
        f"p50 {p50:.0f} ms, p99 {p99:.0f} ms (per_service)",
        f"per_handler: p50 {base50:.0f} ms, p99 {base99:.0f} ms",
        base99 / p99 if p99 else None,
        "p99 <= 200 ms (at most one slow run ahead of it)",
        p99 <= 200,
        {"per_service p99 (ms)": p99, "per_handler p99 (ms)": base99},
    )


def _env(layout: str) -> dict[str, str]:
    return {"AMQP_EVENTS_QUEUE_LAYOUT": layout}


def _app(run: Run, layout: str):  # type: ignore[no-untyped-def]
    """A fresh import of bench/apps/fleet.py bound to ``run``'s vhost, in ``layout``."""
    import importlib

    os.environ.update({"BROKER_URL": run.url, "MARKS_FILE": str(run.marks), "SERVICE": "bench", **_env(layout)})
    import fleet

    try:
        return importlib.reload(fleet).app
    finally:  # read when the app was made; the workers of later scenarios must not inherit it
        os.environ.pop("AMQP_EVENTS_QUEUE_LAYOUT")


def _fill(run: Run, layout: str, count: int) -> None:
    app = _app(run, layout)
    app.declare_topology()
    with app.batch():
        for n in range(count):
            app.fire(f"fleet.e{n % HANDLERS:02d}", [n, time.time()], {})
    app.close()
