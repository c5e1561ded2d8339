"""Run the benchmarks: ``python -m bench`` (full: writes BENCHMARKS.md and bench/chart.png) or ``--quick``.

Starts its own private RabbitMQ node, runs every scenario with its baselines
in the same run, and reports ratios. ``--quick`` (used in CI) only proves the
suite still runs: it asserts no speed.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from amqp_events.local.cluster import LocalCluster
from amqp_events.local.postgres import LocalPostgres
from amqp_events.local.redis import LocalRedis
from bench import (
    cloud_events,
    console,
    coroutines,
    fleet,
    flow_control,
    flow_pace,
    handling,
    history,
    in_process,
    ordering,
    outbox,
    scenarios,
    tracing,
)
from bench import cluster as cluster_bench
from bench.harness import BENCH, Bench
from bench.report import chart, markdown, text_table
from bench.scenarios import Result

NOTES = BENCH / "NOTES.md"


def interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, no report files (CI)")
    parser.add_argument("--only", help="run only scenarios whose function name contains this")
    options = parser.parse_args()
    # A SIGTERM must stop the broker and workers started here, as Ctrl-C does.
    signal.signal(signal.SIGTERM, interrupt)
    size = scenarios.QUICK if options.quick else scenarios.FULL
    if not Path(handling.FASTSTREAM).exists():
        sys.exit(f"{handling.FASTSTREAM} is missing: install the bench extra (pip install -e '.[bench]')")
    started = time.monotonic()
    results: list[Result] = []

    def keep(*found: Result) -> None:
        """Each result printed as its scenario ends, so that a run stopped later keeps what it measured."""
        for result in found:
            print(text_table([result]), flush=True)
            results.append(result)

    with tempfile.TemporaryDirectory(prefix="amqp-events-bench-") as workdir, Bench(Path(workdir)) as bench:

        def wanted(name: str) -> bool:
            return not options.only or options.only in name

        if wanted("fire_one_at_a_time"):
            keep(scenarios.fire_one_at_a_time(bench, size))
        if wanted("fire_in_a_batch"):
            keep(scenarios.fire_in_a_batch(bench, size))
        if wanted("fire_async"):
            keep(coroutines.fire_async_one_at_a_time(bench, size))
            keep(coroutines.fire_async_in_a_batch(bench, size))
        if wanted("coroutine_handler"):
            keep(coroutines.coroutine_handler_drain(bench, size))
        if wanted("io_bound_drain"):
            keep(coroutines.io_bound_drain(bench, size))
        if wanted("waiting_memory"):
            keep(coroutines.waiting_memory(bench, size))
        one_service = None
        if wanted("end_to_end"):
            solo = scenarios.end_to_end(bench, size, "solo", 1)
            one_service = solo.values["ours"]
            keep(solo, scenarios.end_to_end(bench, size, "prefork", 2))
        if wanted("fan_out"):
            one_service = one_service or scenarios.drain(bench, size, "ours", "solo", 1)
            keep(scenarios.fan_out(bench, size, one_service))
        if wanted("the_command_as_typed"):
            keep(handling.the_command_as_typed(bench, size))
        if wanted("backlog_side_by_side"):
            keep(*handling.backlog_side_by_side(bench, size))
        if wanted("ordered"):
            keep(*ordering.ordered_beside_unordered(bench, size))
        if wanted("history"):
            keep(history.replay_beside_live(bench, size))
        if wanted("celery_line"):
            keep(scenarios.solo_on_each_celery_line(bench, size))
        if wanted("outbox"):
            with LocalPostgres() as postgres:
                for shape in ("minimal", "typical"):
                    keep(outbox.commit_and_fire(bench, postgres, size, shape))
                keep(outbox.relay_throughput(bench, postgres, size))
                keep(outbox.commit_to_publish_latency(bench, postgres, size, Path(workdir)))
        if wanted("inbox"):
            with LocalPostgres() as postgres, LocalRedis() as redis:
                keep(*outbox.effect_throughput(bench, postgres, redis.url, size))
        if wanted("cluster"):
            cluster = LocalCluster(Path(workdir) / "cluster", 3)
            cluster.start()
            try:
                keep(*cluster_bench.cluster_against_one_node(bench, cluster, size))
                keep(cluster_bench.recovery_after_a_node_kill(bench, cluster, size))
            finally:
                cluster.stop()
        if wanted("fleet"):
            cluster = LocalCluster(Path(workdir) / "fleet-cluster", 3)
            cluster.start()
            try:
                keep(*fleet.fleet_on_a_cluster(bench, cluster, size))
            finally:
                cluster.stop()
        if wanted("fifty_handlers"):
            keep(fleet.fifty_handlers_drain(bench, size))
        if wanted("slow_beside_fast"):
            keep(fleet.slow_beside_fast(bench, size))
        if wanted("tracing"):
            keep(*tracing.firing(bench, size))
            keep(*tracing.handling(bench, size))
        if wanted("cloudevents"):
            keep(cloud_events.firing(bench, size))
            keep(*cloud_events.handling(bench, size))
        if wanted("limits_rate"):
            keep(flow_control.rate_accuracy(bench, size))
        if wanted("limits_kills"):
            keep(flow_control.concurrency_under_kills(bench, size))
        if wanted("limits_overhead"):
            keep(*flow_control.overhead(bench, size))
        if wanted("limits_memory"):
            keep(flow_control.memory_while_over_limit(bench, size))
        if wanted("limits_pace"):
            keep(flow_pace.pace(bench, size))
        if wanted("limits_order"):
            keep(flow_pace.order(bench, size))
        if wanted("test_module"):
            keep(in_process.a_test_module(bench, size))
        if wanted("console"):
            keep(console.pages_with_a_full_archive(bench, size))
        if wanted("memory"):
            keep(scenarios.memory_while_waiting(bench, size))
        if wanted("accuracy"):
            keep(scenarios.retry_delay_accuracy(bench, size))
    seconds = time.monotonic() - started
    print(f"\n{len(results)} scenarios in {seconds:.0f}s")
    if not options.quick and not options.only:
        root = BENCH.parent
        # The table first: a run's figures are kept even where the chart cannot be drawn (no matplotlib).
        (root / "BENCHMARKS.md").write_text(markdown(results, seconds, NOTES.read_text()))
        chart(results, BENCH / "chart.png")
        print(f"wrote {root / 'BENCHMARKS.md'} and {BENCH / 'chart.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
