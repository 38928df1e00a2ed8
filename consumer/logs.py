"""structlog set-up: one line per event, for people (console) or machines (json)."""

from __future__ import annotations

import logging
import sys

import structlog

from settings import LogFormat


def configure(log_format: LogFormat, level: int = logging.INFO) -> None:
    """Route structlog and the standard library (aio-pika) to stderr in one format."""
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if log_format is LogFormat.JSON
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
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
