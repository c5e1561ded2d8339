"""OpenTelemetry spans for events (the ``[otel]`` extra): one trace context from the request that fired an
event to every attempt of every service that handled it.

* Firing is a PRODUCER span ``publish <event>``; its W3C context (``traceparent``, ``tracestate``,
  ``baggage``) goes into the message's headers, which retries, delays and replays keep as they are.
* Each handler attempt is a CONSUMER span ``process <event>`` that *links* to that context: a new
  trace per attempt, so retries never nest inside each other (or, with ``amqp_events_trace_as_child``,
  a child of the producer span: one trace).
* Archiving stamps the attempt's own context into the archived copy (``archive_traceparent``); a replay
  is a PRODUCER span ``replay <event>`` linking to the producer and to that attempt, and its context
  travels as ``replay_traceparent``, to which the replayed attempts link too.

Everything here costs one provider check when no tracer provider is configured (or the extra is not
installed).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from amqp_events.message import ARCHIVE_TRACEPARENT, DUE_AT, FIRED_BY, REPLAY_TRACEPARENT, queue_wait

if TYPE_CHECKING:
    from amqp_events.archive import ArchivedMessage
    from amqp_events.message import OutgoingMessage
    from amqp_events.outcome import Delivery, Outcome

try:
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    # The contexts of archived attempts and replays always travel as W3C ``traceparent`` strings.
    _W3C = TraceContextTextMapPropagator()
except ImportError:  # the [otel] extra is not installed
    trace = None  # type: ignore[assignment]

_TRACER_NAME = "amqp_events"


def enabled() -> bool:
    """Is an OpenTelemetry tracer provider configured in this process?"""
    if trace is None:
        return False
    return not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def publishing(service: str, message: OutgoingMessage, delay: int) -> Any:
    """The span of firing ``message`` (``with``); its context is injected into the message's headers."""
    if not enabled():
        return nullcontext()
    return _publishing(service, message, delay)


@contextmanager
def _publishing(service: str, message: OutgoingMessage, delay: int) -> Iterator[None]:
    event = message.event
    attributes = {
        **_messaging("publish", "send", message.exchange, event, message.message_id),
        "amqp_events.service": service,
        "amqp_events.event": event,
        "amqp_events.delay_seconds": delay,
    }
    with _tracer().start_as_current_span(f"publish {event}", kind=SpanKind.PRODUCER, attributes=attributes):
        propagate.inject(message.headers)
        yield


def processing(service: str, handler: str, delivery: Delivery, as_child: bool) -> Any:
    """The span of one handler attempt (``with``): links to the producer's context, or is its child."""
    if not enabled():
        return nullcontext()
    return _processing(service, handler, delivery, as_child)


@contextmanager
def _processing(service: str, handler: str, delivery: Delivery, as_child: bool) -> Iterator[None]:
    headers = delivery.headers
    producer = propagate.extract(headers)
    links = _links(producer, headers.get(REPLAY_TRACEPARENT))
    if trace.get_current_span().is_recording():
        # Celery's own instrumentation opened a span for this task (the producer's child): nest in it,
        # so that both make one tree.
        parent: Context | None = None
    else:
        parent = producer if as_child else Context()
    attributes: dict[str, Any] = {
        **_messaging("process", "process", delivery.exchange, delivery.event, delivery.event_id),
        "messaging.destination.subscription.name": delivery.queue,
        "amqp_events.service": service,
        "amqp_events.handler": handler,
        "amqp_events.event": delivery.event,
        "amqp_events.attempt": delivery.retries + 1,
        "amqp_events.retries": delivery.retries,
        "amqp_events.fired_by": str(headers.get(FIRED_BY, "")),
    }
    if headers.get(DUE_AT):
        attributes["amqp_events.due_at"] = str(headers[DUE_AT])
    wait = queue_wait(headers)
    if wait is not None:
        attributes["amqp_events.queue_wait_seconds"] = wait
    with _tracer().start_as_current_span(
        f"process {delivery.event}",
        context=parent,
        kind=SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,  # Celery's Retry/Ignore are how an outcome is told, not errors: see settled()
        set_status_on_exception=False,
    ):
        yield


def settled(outcome: Outcome) -> None:
    """Record a handler attempt's outcome on its span (``success``, ``retry_scheduled``, ``archived``...)."""
    if not enabled():
        return
    span = trace.get_current_span()
    if not span.is_recording():
        return
    from amqp_events.outcome import Ack, Redeliver

    if isinstance(outcome, Ack):
        span.set_attribute("amqp_events.outcome", "duplicate_skipped" if outcome.duplicate else "success")
        return
    if isinstance(outcome, Redeliver):
        what = {"retry": "retry_scheduled", "redeliver": "redelivered"}.get(outcome.why, "handed_back")
        span.set_attributes({"amqp_events.outcome": what, "amqp_events.retry_delay_seconds": outcome.delay})
    else:
        span.set_attributes({"amqp_events.outcome": "archived", "amqp_events.archive_reason": outcome.reason.value})
        outcome.copy.headers[ARCHIVE_TRACEPARENT] = _traceparent(span)  # for the replay to link to
    if outcome.error is not None and isinstance(outcome.error, Exception):
        span.record_exception(outcome.error)
    span.set_status(Status(StatusCode.ERROR, type(outcome.error).__name__ if outcome.error else None))


def replaying(service: str, archived: ArchivedMessage, replay: OutgoingMessage, by: str) -> Any:
    """The span of replaying ``archived`` (``with``): it stamps its context into ``replay``'s headers."""
    if not enabled():
        return nullcontext()
    return _replaying(service, archived, replay.headers, by)


@contextmanager
def _replaying(service: str, archived: ArchivedMessage, stamped: MutableMapping[str, Any], by: str) -> Iterator[None]:
    event, event_id = archived.event, archived.id
    links = _links(propagate.extract(archived.headers), archived.headers.get(ARCHIVE_TRACEPARENT))
    attributes = {
        **_messaging("replay", "send", "", event, event_id),
        "amqp_events.service": service,
        "amqp_events.event": event,
        "amqp_events.replayed_by": by,
    }
    with _tracer().start_as_current_span(
        f"replay {event}", context=Context(), kind=SpanKind.PRODUCER, links=links, attributes=attributes
    ) as span:
        stamped[REPLAY_TRACEPARENT] = _traceparent(span)
        yield


def log_fields() -> dict[str, str]:
    """``trace_id``/``span_id`` of the current span, for log lines (empty without tracing)."""
    if not enabled():
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": trace.format_trace_id(context.trace_id), "span_id": trace.format_span_id(context.span_id)}


_tracers: dict[int, Any] = {}


def _tracer() -> Any:
    """The library's tracer from the current provider (made once per provider: the SDK builds a new one per call)."""
    provider = trace.get_tracer_provider()
    tracer = _tracers.get(id(provider))
    if tracer is None:
        from amqp_events import __version__

        tracer = _tracers[id(provider)] = provider.get_tracer(_TRACER_NAME, __version__)
    return tracer


def _messaging(operation: str, kind: str, exchange: str, routing_key: str, message_id: str) -> dict[str, Any]:
    """The messaging semantic conventions' attributes of a span."""
    return {
        "messaging.system": "rabbitmq",
        "messaging.operation.name": operation,
        "messaging.operation.type": kind,
        "messaging.destination.name": exchange or "amq.default",
        "messaging.rabbitmq.destination.routing_key": routing_key,
        "messaging.message.id": message_id,
    }


def _links(producer: Context, *traceparents: Any) -> list[Link]:
    """Links to the producer's context and to each other context given as a ``traceparent`` string."""
    contexts = [producer, *(_W3C.extract({"traceparent": value}) for value in traceparents if value)]
    spans = (trace.get_current_span(context).get_span_context() for context in contexts)
    return [Link(span) for span in spans if span.is_valid]


def _traceparent(span: Any) -> str:
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")
