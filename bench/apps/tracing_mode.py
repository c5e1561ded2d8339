"""``TRACING`` of a benchmark process, set up before the library is imported.

``absent``: as if the ``[otel]`` extra were not installed (its import fails); ``idle``: installed, no tracer
provider (the default); ``on``: the SDK with a batch span processor whose exporter drops the spans (what
exporting costs depends on the exporter, and happens in the processor's own thread; an in-memory exporter
would keep every span, and the garbage collector would walk them all again and again).
"""

import os
import sys

MODE = os.environ.get("TRACING", "idle")
if MODE == "absent":
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # makes `import opentelemetry` fail
elif MODE == "on":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)
