"""``TRACING`` of a benchmark process, set up before the library is imported.

``absent``: as if the ``[otel]`` extra were not installed (its import fails); ``idle``: installed, no tracer
provider (the default); ``on``: the SDK with a batch span processor whose exporter drops the spans (what
exporting costs depends on the exporter, and happens in the processor's own thread; an in-memory exporter
would keep every span, and the garbage collector would walk them all again and again); ``sampled``: as ``on``,
with a sampler a busy fleet runs, one trace in ten (``ParentBased(TraceIdRatioBased(0.1))``).
"""

import os
import sys

MODE = os.environ.get("TRACING", "idle")
if MODE == "absent":
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # makes `import opentelemetry` fail
elif MODE in ("on", "sampled"):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Dropped(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            return SpanExportResult.SUCCESS

    provider = TracerProvider(ParentBased(TraceIdRatioBased(0.1)) if MODE == "sampled" else None)
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)
