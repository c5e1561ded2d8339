"""What the CloudEvents wire format costs: firing one event at a time, and a solo worker handling waiting
events that arrived as CloudEvents, each beside the Celery format in the same run."""

from __future__ import annotations

import time

from bench.harness import Bench, median
from bench.scenarios import Result, Size, drain, ours_app

FORMATS = ("celery", "cloudevents")


def firing(bench: Bench, size: Size) -> Result:
    """Events/s fired one at a time (each confirmed) in each wire format, rounds alternating."""
    rates: dict[str, list[float]] = {wire_format: [] for wire_format in FORMATS}
    with bench.run("cloudevents-fire") as run:
        app = ours_app(run)
        app.declare_topology()  # the event's queue exists: every publish is routed
        for n in range(200):  # warm up: connected
            app.fire("bench.noop", kwargs={"n": n})
        for round_ in range(size.fire_rounds):
            for wire_format in FORMATS[round_ % 2 :] + FORMATS[: round_ % 2]:
                started = time.perf_counter()
                for n in range(size.fire_per_round):
                    app.fire("bench.noop", kwargs={"n": n}, wire_format=wire_format)
                rates[wire_format].append(size.fire_per_round / (time.perf_counter() - started))
        app.close()
    return _compared("firing one event at a time", rates, 0.9)


def handling(bench: Bench, size: Size) -> Result:
    """Events/s one solo worker handles, ``size.drain`` waiting, fired in each wire format."""
    rates: dict[str, list[float]] = {wire_format: [] for wire_format in FORMATS}
    for repeat in range(size.repeats):
        for wire_format in FORMATS[repeat % 2 :] + FORMATS[: repeat % 2]:
            rates[wire_format].append(drain(bench, size, "ours", "solo", 1, wire_format=wire_format))
    return _compared(f"handling {size.drain:,} waiting events, -P solo", rates, 0.95)


def _compared(what: str, rates: dict[str, list[float]], target: float) -> Result:
    celery, cloud_events = (median(rates[wire_format]) for wire_format in FORMATS)
    ratio = cloud_events / celery
    return Result(
        f"{what}, as CloudEvents (binary mode)",
        f"{cloud_events:,.0f} events/s",
        f"the Celery format: {celery:,.0f} events/s",
        ratio,
        f">= {target:g}x the Celery format",
        ratio >= target,
        {"CloudEvents": cloud_events, "Celery format": celery},
        {"CloudEvents": rates[FORMATS[1]], "Celery format": rates[FORMATS[0]]},
    )
