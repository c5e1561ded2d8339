"""``TRACING`` of a benchmark process, set up before the library is imported.

``absent``: as if the ``[otel]`` extra were not installed (its import fails); ``idle``: installed, no tracer
provider (the default); ``on``: the SDK with a batch span processor exporting to memory.
"""

import os
import sys

MODE = os.environ.get("TRACING", "idle")
if MODE == "absent":
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # makes `import opentelemetry` fail
elif MODE == "on":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(provider)
