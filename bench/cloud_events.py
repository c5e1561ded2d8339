"""What the CloudEvents wire format costs: firing one event at a time, and a solo worker handling waiting
events that arrived as CloudEvents, each beside the Celery format in the same run; then what reading one costs beside
the ``cloudevents`` SDK alone reading the same message (the floor were the worker to read it with the SDK)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone

from amqp_events.wire import cloud_events
from bench.harness import Bench, in_turn, median
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
            for wire_format in in_turn(FORMATS, round_):
                started = time.perf_counter()
                for n in range(size.fire_per_round):
                    app.fire("bench.noop", kwargs={"n": n}, wire_format=wire_format)
                rates[wire_format].append(size.fire_per_round / (time.perf_counter() - started))
        app.close()
    return _compared("firing one event at a time", rates, 0.9)


def handling(bench: Bench, size: Size) -> list[Result]:
    """Events/s one solo worker handles, ``size.drain`` waiting, fired in each wire format; then the reading alone."""
    rates: dict[str, list[float]] = {wire_format: [] for wire_format in FORMATS}
    for repeat in range(size.repeats):
        for wire_format in in_turn(FORMATS, repeat):
            rates[wire_format].append(drain(bench, size, "ours", "solo", 1, wire_format=wire_format))
    what = f"handling {size.drain:,} waiting events, -P solo"
    return [_compared(what, rates, 0.95), _reading_beside_the_sdk(what, rates, size)]


def _reading_beside_the_sdk(what: str, rates: dict[str, list[float]], size: Size) -> Result:
    """Seconds per message reading a CloudEvent as the bench fires it (binary mode, the library's own reading)
    beside the SDK's ``from_binary`` of the same message, rounds alternating in this process; and what the format
    adds to each event in the worker (the two drains above)."""
    from cloudevents.core.bindings import rabbitmq
    from cloudevents.core.formats.json import JSONFormat
    from cloudevents.core.v1.event import CloudEvent

    headers = cloud_events.binary_headers("bench.noop", str(uuid.uuid4()), "bench", datetime.now(timezone.utc))
    body, json_format = b'{"n": 1, "last": false}', JSONFormat()

    def ours() -> None:
        cloud_events.as_event_message(headers, body, "application/json")

    def sdk_alone() -> None:
        rabbitmq.from_binary(rabbitmq.RabbitMQMessage(headers, "application/json", body), json_format, CloudEvent)

    readers: dict[str, Callable[[], None]] = {"ours": ours, "SDK alone": sdk_alone}
    seconds: dict[str, list[float]] = {name: [] for name in readers}
    count = max(size.drain, 5000)
    for round_ in range(3):
        for name in in_turn(list(readers), round_):
            read, started = readers[name], time.perf_counter()
            for _ in range(count):
                read()
            seconds[name].append((time.perf_counter() - started) / count)
    reading, floor = median(seconds["ours"]), median(seconds["SDK alone"])
    added = 1 / median(rates["cloudevents"]) - 1 / median(rates["celery"])
    return Result(
        f"{what}, as CloudEvents: reading one, beside the SDK alone reading it",
        f"reading: {reading * 1e6:,.1f} us per event (the format adds {added * 1e6:,.0f} us per event in the worker)",
        f"the cloudevents SDK alone, from_binary of the same message: {floor * 1e6:,.1f} us per event",
        reading / floor,
        "reported (the share of the SDK's reading)",
        None,
        {"ours (us)": reading * 1e6, "SDK alone (us)": floor * 1e6, "added in the worker (us)": added * 1e6},
        {name: [each * 1e6 for each in figures] for name, figures in seconds.items()},
    )


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
