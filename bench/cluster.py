"""Benchmarks on a three-node cluster: against one node in the same run, and the time to recover from a node kill."""

from __future__ import annotations

import threading
import time

from amqp_events import PublishError
from amqp_events.local.cluster import LocalCluster
from bench.harness import Bench, median, percentile, throughput
from bench.scenarios import Result, Size, ours_app


def cluster_against_one_node(bench: Bench, cluster: LocalCluster, size: Size) -> list[Result]:
    """Batch firing and a solo worker draining ``size.drain`` waiting events, on the cluster and on one node."""
    rates: dict[str, dict[str, list[float]]] = {kind: {"cluster": [], "node": []} for kind in ("batch", "drain")}
    for _ in range(size.repeats):
        for where, broker in (("node", None), ("cluster", cluster)):
            with bench.run(f"{where}-e2e", broker) as run:
                app = ours_app(run)
                app.declare_topology()
                time.sleep(3)  # quorum queues of a cluster settle their members first
                started = time.perf_counter()
                with app.batch():
                    for n in range(size.drain):
                        app.fire("bench.noop", [n], {"last": n == size.drain - 1})
                rates["batch"][where].append(size.drain / (time.perf_counter() - started))
                app.close()
                with run.worker("ours"):
                    marks = run.wait_marks(lambda marks: any(mark["last"] for mark in marks))
                rates["drain"][where].append(throughput(marks, size.drain))
    results = []
    titles = {"batch": "firing a batch (app.batch())", "drain": "a solo worker draining waiting events"}
    for scenario, title in titles.items():
        on_cluster, on_node = median(rates[scenario]["cluster"]), median(rates[scenario]["node"])
        results.append(
            Result(
                f"{title}, {size.drain:,} events, on a 3-node cluster",
                f"{on_cluster:,.0f} events/s",
                f"one node: {on_node:,.0f}/s",
                on_cluster / on_node,
                "reported (3 nodes and the clients share 2 CPU cores)",
                None,
                {"3-node cluster": on_cluster, "one node": on_node},
            )
        )
    return results


def recovery_after_a_node_kill(bench: Bench, cluster: LocalCluster, size: Size) -> Result:
    """Seconds from SIGKILLing the node that leads a service's queue to the first event handled again."""
    gaps = []
    with bench.run("failover", cluster) as run:
        app = ours_app(run)
        app.conf.amqp_events_publish_timeout = 60.0
        app.declare_topology()
        time.sleep(3)
        fired: dict[int, float] = {}
        stop = threading.Event()

        def fire() -> None:  # an event every 20 ms, each confirmed
            n = 0
            while not stop.is_set():
                try:
                    app.fire("bench.noop", [n], {})
                except PublishError:
                    continue
                fired[n] = time.time()
                n += 1
                time.sleep(0.02)

        with run.worker("ours", env={"MARK_ALL": "1"}):
            stream = threading.Thread(target=fire, daemon=True)
            stream.start()
            for _ in range(size.repeats + 1):
                time.sleep(3)
                leader = _leader(cluster, run.vhost, "bench:bench.noop")
                killed_at = time.time()
                cluster.kill(leader)

                def back(marks: list[dict], killed_at: float = killed_at) -> bool:
                    return _handled_after(marks, fired, killed_at) is not None

                marks = run.wait_marks(back, timeout=120)
                gaps.append(_handled_after(marks, fired, killed_at) - killed_at)  # type: ignore[operator]
                cluster.start()
            stop.set()
            stream.join(60)
        app.close()
    p50, worst = percentile(gaps, 0.5), max(gaps)
    return Result(
        f"from SIGKILLing the node leading the queue to the first event fired after it handled ({len(gaps)} kills)",
        f"p50 {p50:.1f} s, max {worst:.1f} s",
        "-",
        None,
        "<= 10 s",
        worst <= 10,
        {"p50 (s)": p50, "max (s)": worst},
    )


def _leader(cluster: LocalCluster, vhost: str, queue: str) -> int:
    import urllib.parse

    info = cluster.management.request("GET", f"/api/queues/{urllib.parse.quote(vhost, safe='')}/{queue}")
    return [cluster.node_name(n) for n in range(cluster.size)].index(info["leader"])


def _handled_after(marks: list[dict], fired: dict[int, float], moment: float) -> float | None:
    """When the first event fired after ``moment`` was handled (``None``: none yet)."""
    after = [mark["time"] for mark in marks if fired.get(mark["n"], 0) > moment]
    return min(after) if after else None
