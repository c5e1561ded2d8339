"""What tracing costs: firing and handling with the OpenTelemetry SDK on, with the extra installed but no
tracer provider, and without the extra, measured side by side in one run (``bench/apps/tracing_mode.py``)."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.harness import APPS, Bench, in_turn, median
from bench.scenarios import Result, Size, drain, ours_app

MODES = ("absent", "idle", "on", "sampled")
RECORDING = ("on", "sampled")  # the modes that record spans: every one, or one trace in ten


def firing(bench: Bench, size: Size) -> list[Result]:
    """Events/s fired one at a time (confirmed), each mode in a process of its own, modes alternating."""
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    with bench.run("tracing-fire") as run:
        ours_app(run).declare_topology()  # the event's queue exists: every publish is routed
        for round_ in range(size.fire_rounds):
            for mode in in_turn(MODES, round_):  # each mode first in turn: the queue grows
                argv = [sys.executable, str(APPS / "traced_fire.py"), str(size.fire_per_round)]
                done = subprocess.run(
                    argv, env={**run.env(), "TRACING": mode}, cwd=APPS, capture_output=True, text=True, timeout=300
                )
                if done.returncode:
                    raise RuntimeError(f"traced_fire.py ({mode}) failed: {done.stderr}")
                rates[mode].append(float(done.stdout.split()[-1]))
    what = "firing one event at a time"
    floors = (_floor(what, rates, mode, size, "fire") for mode in RECORDING)
    return [*_compared(what, rates, "events/s", 0.95), *floors]


def handling(bench: Bench, size: Size) -> list[Result]:
    """Events/s one solo worker handles, ``size.drain`` waiting, in each mode; then what the SDK alone costs."""
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    for repeat in range(size.repeats):
        for mode in in_turn(MODES, repeat):
            rates[mode].append(drain(bench, size, "ours", "solo", 1, worker_env={"TRACING": mode}))
    what = f"handling {size.drain:,} waiting events, -P solo"
    floors = (_floor(what, rates, mode, size, "handle") for mode in RECORDING)
    return [*_compared(what, rates, "events/s", 0.9), *floors]


def _floor(what: str, rates: dict[str, list[float]], mode: str, size: Size, kind: str) -> Result:
    """The SDK's own cost per event (``bench/apps/traced_floor.py``: the same span, alone; ``kind``: a handled or
    a fired event's) beside what tracing adds to an event in ``mode``; and the best ratio that cost leaves, were
    the library's own part nothing."""
    floors = []
    for _ in range(3):
        argv = [sys.executable, str(APPS / "traced_floor.py"), str(max(size.drain, 5000)), kind]
        done = subprocess.run(argv, env={**os.environ, "TRACING": mode}, cwd=APPS, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"traced_floor.py ({mode}) failed: {done.stderr}")
        floors.append(float(done.stdout.split()[-1]))
    floor, untraced = median(floors), 1 / median(rates["absent"])
    added = 1 / median(rates[mode]) - untraced
    best = untraced / (untraced + floor)
    sampled = "one trace in ten sampled" if mode == "sampled" else "every trace sampled"
    return Result(
        f"{what}, traced ({sampled}): the SDK alone, the floor",
        f"tracing adds {added * 1e6:,.0f} us per event",
        f"the SDK alone: {floor * 1e6:,.0f} us per event (the same span; at best {best:.2f}x without tracing)",
        floor / added if added > 0 else None,
        "the SDK's share of what tracing adds",
        None,
        {"added (us)": added * 1e6, "SDK alone (us)": floor * 1e6},
        {"SDK alone (us)": [each * 1e6 for each in floors]},
    )


def _compared(what: str, rates: dict[str, list[float]], unit: str, target: float) -> list[Result]:
    absent, idle, on, sampled = (median(rates[mode]) for mode in MODES)
    traced, untraced, one_in_ten = on / absent, idle / absent, sampled / absent
    return [
        Result(
            f"{what}, traced (SDK, batch exporter)",
            f"{on:,.0f} {unit}",
            f"without the [otel] extra: {absent:,.0f} {unit}",
            traced,
            f">= {target:g}x without tracing",
            traced >= target,
            {"traced": on, "no extra": absent},
            {"traced": rates["on"], "no extra": rates["absent"]},
        ),
        Result(
            f"{what}, traced, one trace in ten sampled (ParentBased(TraceIdRatioBased(0.1)))",
            f"{sampled:,.0f} {unit}",
            f"without the [otel] extra: {absent:,.0f} {unit}",
            one_in_ten,
            f">= {target:g}x without tracing",
            one_in_ten >= target,
            {"1 in 10 sampled": sampled, "no extra": absent},
            {"1 in 10 sampled": rates["sampled"], "no extra": rates["absent"]},
        ),
        Result(
            f"{what}, [otel] installed, no tracer provider",
            f"{idle:,.0f} {unit}",
            f"without the [otel] extra: {absent:,.0f} {unit}",
            untraced,
            ">= 0.98x without the extra",
            untraced >= 0.98,
            {"no provider": idle, "no extra": absent},
            {"no provider": rates["idle"], "no extra": rates["absent"]},
        ),
    ]
