"""OpenTelemetry tracing: on only when the process is set up for it.

Tracing is on when the ``otel`` extra (opentelemetry-api) is installed and
a real TracerProvider is set by the time the worker is built: by running
``opentelemetry-instrument semel consume`` (which configures the SDK from
the ``OTEL_*`` variables), or by the handler's module when it is imported.
semel never sets a provider itself, so it never decides where traces go.

When it is off, the pipeline gets its observer unchanged: OpenTelemetry is
not even imported, and no span or attribute is built per delivery.
"""

from __future__ import annotations

from semel.consumer.delivery.observe import Observer


def traced(observer: Observer, queue: str) -> Observer:
    """``observer``, plus one span per delivery of ``queue`` when tracing is on."""
    try:
        from opentelemetry import trace
    except ImportError:  # the otel extra is not installed
        return observer
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return observer  # nobody configured OpenTelemetry in this process
    from semel.consumer.ops.spans import SpanObserver

    return SpanObserver(observer, trace.get_tracer("semel", tracer_provider=provider), queue)
