"""Catching up from the history beside draining live, in one run: the same events, the same worker.

Live: a worker of the ``ordered`` app (``-P threads -c 4``) drains its
backlog of ``bench.unordered`` events. History: the same number of events,
fired before the service existed, kept only by the history; the worker
handles them while ``history replay`` (no rate bound) reads the stream and
sends them to its queue. Both are timed by the handler's marks, from the
event at 10% to the one at 90%.
"""

from __future__ import annotations

import importlib
import os
from datetime import datetime, timedelta, timezone

from amqp_events import events_app
from amqp_events.history import Query
from bench.harness import Bench, median, steady_throughput
from bench.ordering import CONCURRENCY, POOL, _all_marked, drained
from bench.scenarios import Result, Size


def replayed(bench: Bench, size: Size) -> float:
    with bench.run("history-replay") as run:
        since = datetime.now(timezone.utc) - timedelta(seconds=1)
        teller = events_app("teller", broker_url=run.url, amqp_events_history=True)
        teller.declare_topology()
        count = size.drain
        with teller.batch():
            for n in range(count):
                teller.fire("bench.unordered", kwargs={"n": n, "key": f"k{n}", "last": n == count - 1})
        teller.close()
        os.environ.update({"BROKER_URL": run.url, "SERVICE": "bench"})
        import ordered

        app = importlib.reload(ordered).app
        run.extra_env = {"MARK_EVERY": str(max(1, count // 40))}
        with run.worker("ordered", pool=POOL, concurrency=CONCURRENCY):
            app.history().replay(Query(since=since), handler="unordered", rate=0).run()
            marks = run.wait_marks(lambda marks: _all_marked(marks, count))
        app.close()
        return steady_throughput(marks, count)


def replay_beside_live(bench: Bench, size: Size) -> Result:
    replay = median([replayed(bench, size) for _ in range(size.repeats)])
    live = median([drained(bench, size, "bench.unordered", size.drain) for _ in range(size.repeats)])
    return Result(
        f"catching up on {size.drain:,} events from the history (-P {POOL} -c {CONCURRENCY})",
        f"{replay:,.0f} events/s",
        f"draining the same backlog live: {live:,.0f}/s ({replay / live:.2f}x)",
        replay / live,
        ">= 1.0x live",
        replay >= live,
        {"history replay": replay, "live backlog": live},
    )
