"""structlog set-up: one line per event, for people (console) or machines (json).

The standard library's lines (a handler's own ``logging`` calls, libraries')
go through the same renderer at ``SEMEL_LOG_LEVEL``, with the structlog
context variables merged in, so a handler's lines carry its delivery's key
(:mod:`semel.consumer.delivery.log_lines`) whichever way it logs. Only the
libraries named in :data:`QUIETENED` are held at warning; the root logger
is never quietened, or a handler's own lines would vanish.

Every string a line carries passes :func:`semel.settings.redact.redact` on the way
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

from semel.settings.redact import redact

# Libraries semel uses that log routine events at info or debug (a
# reconnect attempt, credentials found, each pooled connection): warnings
# are enough. A service quietens its own libraries the same way, by name.
QUIETENED = (
    "aio_pika",
    "aiormq",
    "pamqp",
    "asyncio",
    "botocore",
    "boto3",
    "s3transfer",
    "urllib3",
    "psycopg",
    "redis",
    "opentelemetry",
)


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
        # Every secret redact() masks sits behind a ':' (a URL's user info)
        # or an '=' (key=value): a string with neither is left as it is,
        # without the cost of parsing it.
        if isinstance(value, str) and (":" in value or "=" in value):
            event[name] = redact(value)
    return event


class ThroughStructlog(logging.Handler):
    """Writes the standard library's lines with structlog's writer.

    Its lock (one per file) is the one structlog's own lines take: a line a
    plain handler's thread logs through ``logging`` cannot land inside one the
    event loop writes (a line and its newline are two writes).
    """

    def __init__(self, writer: structlog.PrintLogger) -> None:
        super().__init__()
        self._writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._writer.msg(self.format(record))
        except Exception:  # as logging.StreamHandler: reported, never raised into the caller
            self.handleError(record)


def configure(setup: LogSetup, *, stdlib: bool = True) -> None:
    """Route structlog and the standard library (aio-pika) to stderr in one format.

    Without ``stdlib`` only semel's own (structlog) lines are configured: inside
    an application (the front doors) the standard library's logging is the
    application's, and its root handlers are left alone.
    """
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if setup.as_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
    ]
    # Stamped after redaction: a timestamp holds no secret, only colons.
    stamped: list[structlog.types.Processor] = [
        structlog.processors.format_exc_info,
        redact_fields,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        renderer,
    ]
    structlog.configure(
        processors=[*shared, *stamped],
        wrapper_class=structlog.make_filtering_bound_logger(setup.level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    if not stdlib:
        return
    handler = ThroughStructlog(structlog.PrintLogger(file=sys.stderr))
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *stamped],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(setup.level)
    for name in QUIETENED:
        logging.getLogger(name).setLevel(max(setup.level, logging.WARNING))
    # aiormq reports each refused connection as an error, and aio-pika and
    # semel report the same event as a warning: one line is enough.
    logging.getLogger("aiormq.connection").setLevel(logging.CRITICAL)
