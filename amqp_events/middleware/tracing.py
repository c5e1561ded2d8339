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

Without a tracer provider every hook costs an attribute test: the provider is looked for at most once a
second (OpenTelemetry sets it once for good, so one found is kept).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from amqp_events.core.context import Attempt, Firing, Middleware, Replay
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Ack, Hold, Outcome, Redeliver
from amqp_events.settings import Settings
from amqp_events.wire.archive_headers import ARCHIVE_TRACEPARENT, REPLAY_TRACEPARENT
from amqp_events.wire.message import DUE_AT, FIRED_BY, event_id, queue_wait

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    # The contexts of archived attempts and replays always travel as W3C ``traceparent`` strings.
    _W3C = TraceContextTextMapPropagator()
except ImportError:  # the [otel] extra is not installed
    trace = None  # type: ignore[assignment]

INSTALLED = trace is not None
_TRACER_NAME = "amqp_events"


def enabled() -> bool:
    """Is an OpenTelemetry tracer provider configured in this process?"""
    if trace is None:
        return False
    return not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def log_fields() -> dict[str, str]:
    """``trace_id``/``span_id`` of the current span, for log lines (empty without tracing)."""
    if not enabled():
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": trace.format_trace_id(context.trace_id), "span_id": trace.format_span_id(context.span_id)}


class ProviderWatch:
    """Is a tracer provider configured? :func:`enabled` reads the environment each time; this looks at most
    once a second until a provider is there, then for good (OpenTelemetry sets the provider once)."""

    INTERVAL = 1.0

    def __init__(self) -> None:
        self.found = False
        self.next_look = 0.0

    def __call__(self) -> bool:
        if self.found:
            return True
        now = time.monotonic()
        if now >= self.next_look:
            self.next_look = now + self.INTERVAL
            self.found = enabled()
        return self.found


class Tracing(Middleware):
    """Spans of firing, handling and replaying (installed by an app when the ``[otel]`` extra is)."""

    @classmethod
    def for_service(cls, settings: Settings, handlers: Sequence[Handler], version: str) -> Tracing | None:
        """With OpenTelemetry installed (the ``[tracing]`` extra)."""
        return cls(version, as_child=settings.trace_as_child) if INSTALLED else None

    def __init__(self, version: str, as_child: bool = False) -> None:
        self.version = version
        #: Each attempt's span is the producer's child instead of a new trace that links to it.
        self.as_child = as_child
        self.on = ProviderWatch()
        self._tracers: dict[int, Any] = {}

    # -- firing ------------------------------------------------------------------------------------------------

    def before_fire(self, firing: Firing) -> None:
        if not self.on():
            return
        message, context = firing.message, firing.context
        event = message.event
        attributes = _messaging("publish", "send", message.exchange, event, message.message_id)
        span = self._tracer().start_span(f"publish {event}", kind=SpanKind.PRODUCER, attributes=attributes)
        if span.is_recording():
            span.set_attributes(
                {
                    "amqp_events.service": context.name,
                    "amqp_events.event": event,
                    "amqp_events.delay_seconds": firing.delay,
                }
            )
        carrier: dict[str, Any] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        firing.message = replace(message, headers={**message.headers, **carrier})
        firing.state["span"] = span
        if not firing.batched:  # current while it is published; a batch's spans end together, unnested
            firing.state["token"] = otel_context.attach(trace.set_span_in_context(span))

    def after_fire(self, firing: Firing, result: str, error: BaseException | None) -> None:
        span = firing.state.pop("span", None)
        if span is None:
            return
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        _end(span, firing.state)

    # -- handling ----------------------------------------------------------------------------------------------

    def before_handle(self, attempt: Attempt) -> Outcome | None:
        if not self.on():
            return None
        delivery = attempt.delivery
        headers = delivery.headers
        producer = propagate.extract(headers)
        links = _links(producer, headers.get(REPLAY_TRACEPARENT))
        if links and not any(link.context.trace_flags.sampled for link in links):
            # Sampled out where it was fired (and replayed): the attempt is not recorded either, nor what its
            # handler traces. The decision is made once, at the trace's head, as ParentBased samplers make it.
            unsampled = trace.NonRecordingSpan(links[0].context)  # its context only: never a sender's baggage
            attempt.state["token"] = otel_context.attach(trace.set_span_in_context(unsampled))
            return None
        if trace.get_current_span().is_recording():
            # Celery's own instrumentation opened a span for this task (the producer's child): nest in it,
            # so that both make one tree.
            parent: Context | None = None
        else:
            parent = producer if self.as_child else Context()
        event = delivery.event
        span = self._tracer().start_span(
            f"process {event}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=_messaging("process", "process", delivery.exchange, event, delivery.event_id),
        )
        if span.is_recording():  # what a sampler that drops it would have cost to build
            span.set_attributes(_attempt_attributes(attempt))
        attempt.state["span"] = span
        attempt.state["token"] = otel_context.attach(trace.set_span_in_context(span))
        return None

    def before_settle(self, attempt: Attempt, outcome: Outcome) -> Outcome:
        """The attempt's outcome on its span; an archived copy records the attempt's context for a replay."""
        span = attempt.state.get("span")
        if span is None:
            return outcome
        span.set_attribute("amqp_events.outcome", outcome.name)
        if isinstance(outcome, Ack | Hold):  # held: its span is the run's, when it runs
            return outcome
        if isinstance(outcome, Redeliver):
            span.set_attribute("amqp_events.retry_delay_seconds", outcome.delay)
        else:
            span.set_attribute("amqp_events.archive_reason", outcome.reason.value)
            headers = {**outcome.copy.headers, ARCHIVE_TRACEPARENT: _traceparent(span)}
            outcome = replace(outcome, copy=replace(outcome.copy, headers=headers))
        if isinstance(outcome.error, Exception):  # Celery's Retry/Ignore are how an outcome is told: not here
            span.record_exception(outcome.error)
        span.set_status(Status(StatusCode.ERROR, type(outcome.error).__name__))
        return outcome

    def after_handle(self, attempt: Attempt, outcome: Outcome | None, error: BaseException | None) -> None:
        _end(attempt.state.pop("span", None), attempt.state)

    # -- replaying ---------------------------------------------------------------------------------------------

    def before_replay(self, replay: Replay) -> None:
        if not self.on():
            return
        message, archived = replay.message, replay.archived_headers
        links = _links(propagate.extract(archived), archived.get(ARCHIVE_TRACEPARENT))
        attributes = {
            **_messaging("replay", "send", "", message.event, event_id(archived)),
            "amqp_events.service": replay.context.name,
            "amqp_events.event": message.event,
            "amqp_events.replayed_by": replay.by,
        }
        span = self._tracer().start_span(
            f"replay {message.event}", context=Context(), kind=SpanKind.PRODUCER, links=links, attributes=attributes
        )
        replay.message = replace(message, headers={**message.headers, REPLAY_TRACEPARENT: _traceparent(span)})
        replay.state["span"] = span
        replay.state["token"] = otel_context.attach(trace.set_span_in_context(span))

    def after_replay(self, replay: Replay, error: BaseException | None) -> None:
        span = replay.state.pop("span", None)
        if span is not None:
            _end(span, replay.state)

    def _tracer(self) -> Any:
        """The library's tracer from the current provider (made once per provider: the SDK makes a new one per
        call)."""
        provider = trace.get_tracer_provider()
        tracer = self._tracers.get(id(provider))
        if tracer is None:
            tracer = self._tracers[id(provider)] = provider.get_tracer(_TRACER_NAME, self.version)
        return tracer


def _end(span: Any, state: dict[str, Any]) -> None:
    token = state.pop("token", None)
    if token is not None:
        otel_context.detach(token)
    if span is not None:
        span.end()


def _attempt_attributes(attempt: Attempt) -> dict[str, Any]:
    """What a recorded attempt's span says beyond the messaging conventions."""
    delivery, context, handler = attempt.delivery, attempt.context, attempt.handler
    headers = delivery.headers
    attributes: dict[str, Any] = {
        "messaging.destination.subscription.name": delivery.queue,
        "amqp_events.service": context.name,
        "amqp_events.handler": handler.name if handler is not None else "",
        "amqp_events.event": delivery.event,
        "amqp_events.attempt": delivery.retries + 1,
        "amqp_events.retries": delivery.retries,
        "amqp_events.fired_by": str(headers.get(FIRED_BY, "")),
    }
    if headers.get(DUE_AT):
        attributes["amqp_events.due_at"] = str(headers[DUE_AT])
    wait = queue_wait(headers, context.now())
    if wait is not None:
        attributes["amqp_events.queue_wait_seconds"] = wait
    return attributes


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


def _links(producer: Context, traceparent: Any) -> list[Link]:
    """Links to the producer's context and to the context a ``traceparent`` string gives, if any."""
    contexts = [producer, _W3C.extract({"traceparent": traceparent})] if traceparent else [producer]
    spans = (trace.get_current_span(context).get_span_context() for context in contexts)
    return [Link(span) for span in spans if span.is_valid]


def _traceparent(span: Any) -> str:
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")
