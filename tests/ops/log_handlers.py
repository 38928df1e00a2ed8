"""Handlers that write log lines of their own, as a user's would, run as
``tests.ops.log_handlers:<name>``.

Each logs through the standard library and through structlog, naming the key,
fence and attempt it was given (``seen``) so a test can tell a line that carries its own
delivery's key from one that carries another's; then, as a stand-in for the
libraries semel quietens, lines at info on their loggers. A body with
``fail_first`` fails its first attempt, logging the traceback, so the retry's
lines carry attempt 2.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

from semel.consumer import Context

USER_LOGGER = "myservice.handlers"
NOISY_LOGGERS = ("aiormq", "aio_pika", "botocore.credentials", "urllib3.connectionpool", "asyncio")
NOISY_LINE = "noisy library line"
NOISY_WARNING = "noisy library warning"
CAUGHT = "caught, retried"

stdlib_log = logging.getLogger(USER_LOGGER)
struct_log = structlog.get_logger(USER_LOGGER)


def _write(context: Context, how: str) -> Any:
    given = f"{context.key} {context.fence} {context.attempt}"
    stdlib_log.debug("stdlib debug line seen=%s", given)
    stdlib_log.info("stdlib line from %s handler seen=%s", how, given)
    struct_log.info("structlog line", handler=how, seen=given)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).info(NOISY_LINE)
    logging.getLogger("aio_pika").warning(NOISY_WARNING)  # quietened, not silenced
    if context.body.get("fail_first") and context.attempt == 1:
        try:
            raise RuntimeError("first attempt fails")
        except RuntimeError:
            stdlib_log.exception(CAUGHT)
            raise
    return None


async def logging_async(context: Context) -> Any:
    return _write(context, "async")


def logging_plain(context: Context) -> Any:
    """A plain ``def`` handler: it runs on a thread of its own."""
    return _write(context, "def")
