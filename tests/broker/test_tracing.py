"""OpenTelemetry tracing on a real broker with real workers: every process (the producer, each service's
worker, the replaying CLI) exports its spans with the SDK's own exporter to one file (``services/traced.py``).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import TESTS

from amqp_events.testing import json_lines, wait_for

pytest.importorskip("opentelemetry.sdk.trace")


class Spans:
    """The spans the test's processes exported, one JSON object per line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def all(self, name: str | None = None, **attributes: Any) -> list[dict[str, Any]]:
        found = json_lines(self.path)
        return sorted(
            (
                span
                for span in found
                if (name is None or span["name"] == name)
                and all(span["attributes"].get(key) == value for key, value in attributes.items())
            ),
            key=lambda span: span["start_time"],
        )

    def wait(self, count: int, name: str, timeout: float = 60, **attributes: Any) -> list[dict[str, Any]]:
        return wait_for(
            lambda: (found := self.all(name, **attributes)) and len(found) >= count and found,
            timeout,
            what=f"{count} span(s) {name} {attributes} (have {self.all()})",
        )


@pytest.fixture
def spans(tmp_path: Path) -> Spans:
    return Spans(tmp_path / "spans.jsonl")


@pytest.fixture
def traced(spans: Spans, start_worker, broker_url):
    """``traced("ledger", FIXED="1")`` starts a worker of ``services.traced`` exporting to ``spans``."""

    def start(service: str, **env: str) -> Any:
        environment = {"SPANS": str(spans.path), "PYTHONPATH": str(TESTS), "SERVICE": service, **env}
        return start_worker("services.traced", env=environment, cwd=TESTS)

    return start


def run(*argv: str, spans: Spans, broker_url: str, **env: str) -> str:
    environment = {**os.environ, "SPANS": str(spans.path), "PYTHONPATH": str(TESTS), "BROKER_URL": broker_url, **env}
    done = subprocess.run(argv, cwd=TESTS, env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def fire(invoice_id: int, spans: Spans, broker_url: str) -> str:
    """Fire ``test.traced`` from a process of its own (with its tracer provider); returns the event id."""
    return run(sys.executable, "-m", "services.traced", str(invoice_id), spans=spans, broker_url=broker_url).strip()


def context(span: dict[str, Any]) -> tuple[str, str]:
    return span["context"]["trace_id"], span["context"]["span_id"]


def links(span: dict[str, Any]) -> list[tuple[str, str]]:
    return [(link["context"]["trace_id"], link["context"]["span_id"]) for link in span["links"]]


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("coroutines", ["0", "1"], ids=["plain", "async"])
def test_one_event_through_retries_the_archive_and_a_replay_makes_one_linked_span_set(
    coroutines, traced, spans, broker_url
):
    traced("ledger", COROUTINES=coroutines)
    mailer = traced("mailer", COROUTINES=coroutines)
    event_id = fire(7, spans, broker_url)
    ledger_runs = spans.wait(3, "process test.traced", **{"amqp_events.service": "ledger"})
    [archived] = spans.wait(1, "process test.traced", **{"amqp_events.service": "mailer"})

    mailer.stop()
    traced("mailer", FIXED="1", COROUTINES=coroutines)  # the fix is deployed: replay what was archived
    cli = str(Path(sys.executable).parent / "amqp-events")
    replay = [cli, "-A", "services.traced", "archive", "replay", "--yes", "--by", "oncall@example.com"]
    out = run(*replay, spans=spans, broker_url=broker_url, SERVICE="mailer")
    assert f"replayed {event_id}" in out
    _, replayed = spans.wait(2, "process test.traced", **{"amqp_events.service": "mailer"})

    [producer] = spans.all("publish test.traced")
    [replay] = spans.all("replay test.traced")
    assert len(spans.all()) == 7  # publish, 3 ledger attempts, 2 mailer attempts, the replay: nothing else

    assert producer["kind"] == "SpanKind.PRODUCER" and producer["parent_id"] is None
    assert producer["attributes"] == {
        "messaging.system": "rabbitmq",
        "messaging.operation.name": "publish",
        "messaging.operation.type": "send",
        "messaging.destination.name": "events",
        "messaging.rabbitmq.destination.routing_key": "test.traced",
        "messaging.message.id": event_id,
        "amqp_events.service": "web",
        "amqp_events.event": "test.traced",
        "amqp_events.delay_seconds": 0,
    }
    runs = [*ledger_runs, archived, replayed]
    for span in runs:  # each attempt: a trace of its own, linked to the one request that fired the event
        assert span["kind"] == "SpanKind.CONSUMER" and span["parent_id"] is None
        assert context(producer) in links(span)
        assert span["context"]["trace_id"] != producer["context"]["trace_id"]
        assert span["attributes"]["messaging.message.id"] == event_id
        assert span["attributes"]["amqp_events.fired_by"] == ""  # the tests' shared user verifies nobody
        assert span["attributes"]["amqp_events.handler"] == "services.traced.on_traced"
        assert span["attributes"]["amqp_events.queue_wait_seconds"] >= 0
    progress = [
        tuple(s["attributes"][f"amqp_events.{key}"] for key in ("attempt", "retries", "outcome")) for s in ledger_runs
    ]
    assert progress == [(1, 0, "retry_scheduled"), (2, 1, "retry_scheduled"), (3, 2, "success")]
    for failed in ledger_runs[:2]:
        assert failed["status"]["status_code"] == "ERROR"
        assert failed["attributes"]["amqp_events.retry_delay_seconds"] == 3
        [error] = failed["events"]
        assert error["name"] == "exception" and error["attributes"]["exception.type"] == "ConnectionError"
    for earlier, later in itertools.pairwise(ledger_runs):  # the 3 s waits were on the broker, never shorter
        assert seconds(later["start_time"]) - seconds(earlier["end_time"]) >= 2.9
        assert "amqp_events.due_at" in later["attributes"]
    assert ledger_runs[2]["status"]["status_code"] == "UNSET" and not ledger_runs[2]["events"]

    assert archived["attributes"]["amqp_events.outcome"] == "archived"
    assert archived["attributes"]["amqp_events.archive_reason"] == "non_retryable"
    assert archived["events"][0]["attributes"]["exception.type"] == "amqp_events.errors.PermanentFailure"
    assert replay["kind"] == "SpanKind.PRODUCER" and replay["attributes"]["amqp_events.replayed_by"] == (
        "oncall@example.com"
    )
    assert set(links(replay)) == {context(producer), context(archived)}  # the request, and the attempt archived
    assert links(replayed) == [context(producer), context(replay)]
    assert replayed["attributes"]["amqp_events.attempt"] == 1  # a replay starts its attempts over
    assert replayed["attributes"]["amqp_events.outcome"] == "success"


def test_context_survives_a_broker_restart_while_a_retry_waits(rabbitmq, traced, spans, broker_url):
    if rabbitmq.node is None:
        pytest.skip("needs the harness's own node (not $AMQP_URL) to restart it")
    traced("ledger")
    fire(8, spans, broker_url)
    spans.wait(1, "process test.traced")
    rabbitmq.node.stop()  # the retry is waiting on the delay ladder
    rabbitmq.node.start()
    runs = spans.wait(3, "process test.traced", timeout=90)
    [producer] = spans.all("publish test.traced")
    assert all(links(span) == [context(producer)] for span in runs)
    assert runs[-1]["attributes"]["amqp_events.outcome"] == "success"


def test_as_a_child_every_attempt_is_in_the_producers_trace(traced, spans, broker_url):
    traced("ledger", TRACE_AS_CHILD="1")
    fire(9, spans, broker_url)
    runs = spans.wait(3, "process test.traced")
    [producer] = spans.all("publish test.traced")
    for span in runs:  # siblings under the producer span: never nested in the previous attempt
        assert span["context"]["trace_id"] == producer["context"]["trace_id"]
        assert span["parent_id"] == producer["context"]["span_id"]


def test_with_celerys_own_instrumentation_there_is_one_tree(traced, spans, broker_url):
    pytest.importorskip("opentelemetry.instrumentation.celery")
    traced("ledger", CELERY_INSTRUMENTATION="1")
    fire(10, spans, broker_url)
    runs = spans.wait(3, "process test.traced")
    [producer] = spans.all("publish test.traced")
    celery_runs = {span["context"]["span_id"]: span for span in spans.all() if span["name"].startswith("run/")}
    assert len(celery_runs) == 3
    for span in runs:  # Celery's task span is the producer's child; ours nests in it and still links
        parent = celery_runs[span["parent_id"]]
        assert parent["parent_id"] == producer["context"]["span_id"]
        assert span["context"]["trace_id"] == producer["context"]["trace_id"]
        assert links(span) == [context(producer)]


def test_an_event_sampled_out_where_it_was_fired_is_not_recorded_where_it_is_handled(traced, spans, broker_url):
    """Head sampling: the decision made where the trace began holds for every attempt (the worker's sampler
    records everything; the first producer's samples nothing)."""
    traced("mailer")  # archived at its first attempt; a solo worker ends one event before it takes the next
    argv = (sys.executable, "-m", "services.traced")
    sampled_out = run(*argv, "21", spans=spans, broker_url=broker_url, OTEL_TRACES_SAMPLER="always_off").strip()
    sampled = fire(22, spans, broker_url)
    spans.wait(1, "process test.traced")
    recorded = {span["attributes"]["messaging.message.id"] for span in spans.all()}
    assert sampled_out not in recorded
    assert recorded == {sampled}


def test_without_a_tracer_provider_there_are_no_spans_and_no_trace_headers(start_worker, broker_url, producer):
    from amqp_events.core.context import Firing
    from amqp_events.middleware import tracing

    assert not tracing.enabled()  # this test process configures none
    firing = Firing(producer.context, producer.event_message("test.traced", [], {"invoice_id": 1}), 0, batched=False)
    middleware = tracing.Tracing("test")
    middleware.before_fire(firing)
    middleware.after_fire(firing, "confirmed", None)
    message = firing.message
    assert not {"traceparent", "tracestate", "baggage"} & set(message.headers)


def test_json_logs_carry_the_event_and_its_trace(traced, spans, broker_url):
    worker = traced("ledger", LOG_FORMAT="json")
    event_id = fire(11, spans, broker_url)
    runs = spans.wait(3, "process test.traced")
    lines = wait_for(
        lambda: (
            (
                found := [
                    json.loads(line)
                    for line in worker.log().splitlines()
                    if line.startswith("{") and '"retrying' in line
                ]
            )
            and len(found) >= 2
            and found
        ),
        30,
        what="two JSON 'retrying' lines",
    )
    first = lines[0]
    assert first["message"].startswith("retrying event=test.traced service=ledger")
    assert (first["event"], first["service"], first["event_id"], first["attempt"], first["handler"]) == (
        "test.traced",
        "ledger",
        event_id,
        1,
        "services.traced.on_traced",
    )
    trace_id, span_id = context(runs[0])
    assert (f"0x{first['trace_id']}", f"0x{first['span_id']}") == (trace_id, span_id)
