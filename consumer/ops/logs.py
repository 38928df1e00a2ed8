"""structlog set-up: one line per event, for people (console) or machines (json).

Every string a line carries passes :func:`settings.redact.redact` on the way
out, so a password inside a URL or DSN (in a store's or the broker's error
text, say) never reaches a log, whichever module logged it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import structlog

from settings.redact import redact


@dataclass(frozen=True, slots=True)
class LogSetup:
    """``SEMEL_LOG_FORMAT`` and ``SEMEL_LOG_LEVEL``."""

    as_json: bool = False
    level: int = logging.INFO


def redact_fields(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Mask credentials in every string field of a line."""
    for name, value in event.items():
        if isinstance(value, str):
            event[name] = redact(value)
    return event


def configure(setup: LogSetup) -> None:
    """Route structlog and the standard library (aio-pika) to stderr in one format."""
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if setup.as_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, redact_fields, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(setup.level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                redact_fields,
                renderer,
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # aio-pika logs every reconnect attempt; warnings are enough.
    root.setLevel(logging.WARNING)
    # aiormq reports each refused connection as an error, and aio-pika and
    # semel report the same event as a warning: one line is enough.
    logging.getLogger("aiormq.connection").setLevel(logging.CRITICAL)
