"""Services that export their spans (the tracing tests): ``SERVICE`` names the service, ``SPANS`` the file
its spans are written to, one JSON object per line, by the OpenTelemetry SDK's own console exporter.

``ledger`` fails twice, then succeeds; ``mailer`` fails for good (archived at once) until ``FIXED`` is set.
``python -m services.traced N`` fires ``test.traced`` with ``invoice_id=N`` as the service ``web``.
"""

import os
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from amqp_events import PermanentFailure, current_event
from amqp_events.celery import events_app
from services.behaviour import maybe_coroutine

if os.environ.get("SPANS"):
    provider = TracerProvider()
    exporter = ConsoleSpanExporter(
        out=open(os.environ["SPANS"], "a"),  # noqa: SIM115  # open for the life of the process
        formatter=lambda span: span.to_json(indent=None) + "\n",
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
if os.environ.get("CELERY_INSTRUMENTATION"):
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    CeleryInstrumentor().instrument()

app = events_app(
    os.environ.get("SERVICE", "web"),
    broker_url=os.environ["BROKER_URL"],
    amqp_events_backoff_base=3,  # every retry waits 3 s on the delay ladder
    amqp_events_backoff_max=3,
    amqp_events_trace_as_child=bool(os.environ.get("TRACE_AS_CHILD")),
    amqp_events_log_format=os.environ.get("LOG_FORMAT", "text"),
)


@app.handler("test.traced")
@maybe_coroutine
def on_traced(invoice_id: int) -> None:
    if app.service == "ledger" and current_event().attempt <= 2:
        raise ConnectionError(f"ledger unavailable for invoice {invoice_id}")
    if app.service == "mailer" and not os.environ.get("FIXED"):
        raise PermanentFailure(f"no address for invoice {invoice_id}")


if __name__ == "__main__":
    print(app.fire("test.traced", kwargs={"invoice_id": int(sys.argv[1])}))
    app.close()
