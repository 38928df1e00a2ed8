"""A handler the tracing test runs, as ``tests.ops.handlers:charge``."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from semel.consumer import Context


async def charge(context: Context) -> Any:
    """Opens a span of its own, as an instrumented handler would."""
    with trace.get_tracer("tests.ops").start_as_current_span("charge card"):
        return {"key": context.key}
