"""What the OpenTelemetry SDK alone costs per event in the tracing mode ``TRACING`` (``on`` or ``sampled``), for
``handle`` (the default): the span an attempt opens, with the same attributes, made current and ended, and the
producer's context read from headers without one (as the bench fires its events); for ``fire``: the span a publish
opens, its context written into the message's headers, made current while it is published and ended. Nothing of the
library runs; prints seconds per event. ``python traced_floor.py COUNT [handle|fire]``."""

import sys
import time

import tracing_mode  # before the SDK is used: its provider and sampler
from opentelemetry import context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

MESSAGING = {
    "messaging.system": "rabbitmq",
    "messaging.operation.name": "process",
    "messaging.operation.type": "process",
    "messaging.destination.name": "events",
    "messaging.rabbitmq.destination.routing_key": "bench.noop",
    "messaging.message.id": "9f0b8d4e-6a53-4a59-9a43-2f6c1c1b7b1e",
}
ATTEMPT = {
    "messaging.destination.subscription.name": "bench:bench.noop",
    "amqp_events.service": "bench",
    "amqp_events.handler": "ours.on_noop",
    "amqp_events.event": "bench.noop",
    "amqp_events.attempt": 1,
    "amqp_events.retries": 0,
    "amqp_events.fired_by": "guest",
    "amqp_events.queue_wait_seconds": 0.25,
}
HEADERS = {"task": "bench.noop", "id": MESSAGING["messaging.message.id"], "fired_at": "2026-12-07T07:00:00+00:00"}

assert tracing_mode.MODE in ("on", "sampled")
tracer = trace.get_tracer_provider().get_tracer("amqp_events", "bench")


def attempt() -> None:
    propagate.extract(HEADERS)
    span = tracer.start_span(
        "process bench.noop", context=Context(), kind=SpanKind.CONSUMER, links=[], attributes=MESSAGING
    )
    if span.is_recording():
        span.set_attributes(ATTEMPT)
    token = context.attach(trace.set_span_in_context(span))
    span.set_attribute("amqp_events.outcome", "ack")
    context.detach(token)
    span.end()


PUBLISHED = {**MESSAGING, "messaging.operation.name": "publish", "messaging.operation.type": "send"}
FIRED = {
    "amqp_events.service": "bench",
    "amqp_events.event": "bench.noop",
    "amqp_events.delay_seconds": 0,
}


def publish() -> None:
    span = tracer.start_span("publish bench.noop", kind=SpanKind.PRODUCER, attributes=PUBLISHED)
    if span.is_recording():
        span.set_attributes(FIRED)
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    token = context.attach(trace.set_span_in_context(span))
    context.detach(token)
    span.end()


count = int(sys.argv[1])
each = publish if sys.argv[2:] == ["fire"] else attempt
for _ in range(1000):  # warm up
    each()
started = time.perf_counter()
for _ in range(count):
    each()
print((time.perf_counter() - started) / count)
