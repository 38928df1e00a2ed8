"""Handlers the end-to-end tests run, as ``tests.consumer.handlers:<name>``.

``scripted`` does what the message body asks, so one consumer serves every
case of a test. Every execution is appended to the ledger file named by
``SEMEL_TEST_LEDGER`` (one JSON line per event, written with O_APPEND so
several processes can share it), which is how the tests count runs.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

from semel.consumer import Context, PermanentError

LEDGER_ENV = "SEMEL_TEST_LEDGER"
ALLOW_DIE_ENV = "SEMEL_TEST_ALLOW_DIE"  # only a consumer subprocess may kill itself


def record(context: Context, event: str) -> None:
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    line = json.dumps(
        {
            "event": event,
            "key": context.key,
            "fence": context.fence,
            "attempt": context.attempt,
            "routing_key": context.routing_key,
            "pid": os.getpid(),
            "t": time.time(),
        }
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


async def scripted(context: Context) -> Any:
    """Body fields: ``sleep`` s, ``fail_until`` attempt, ``permanent``, ``die``, ``result``."""
    record(context, "start")
    body = context.body
    if body.get("die"):
        if os.environ.get(ALLOW_DIE_ENV) != "1":
            raise RuntimeError("refusing to kill the test process")
        os._exit(3)
    if body.get("sleep"):
        await asyncio.sleep(float(body["sleep"]))
    if body.get("permanent"):
        raise PermanentError(str(body["permanent"]))
    if context.attempt <= int(body.get("fail_until", 0)):
        raise RuntimeError(f"transient failure on attempt {context.attempt}")
    record(context, "end")
    return body.get("result", {"key": context.key, "fence": context.fence})


def blocking(context: Context) -> Any:
    """A plain (thread-run) handler; ``sleep`` blocks its thread."""
    record(context, "start")
    time.sleep(float(context.body.get("sleep", 0)))
    record(context, "end")
    return {"slept": context.body.get("sleep", 0)}


def unstorable_error(context: Context) -> Any:
    """Fails for good with an error text no store takes as it is: a NUL, a lone
    surrogate, and far more than an item may hold."""
    record(context, "start")
    raise PermanentError("nul \x00 surrogate \ud800 " + "x" * 500_000)


not_callable = 42


def oversized(context: Context) -> Any:
    """A result larger than DynamoDB's 400 KB item."""
    return {"blob": "x" * 500_000}


def unserialisable(context: Context) -> Any:
    """A result that is not JSON."""
    return {"when": object()}


async def collector(context: Context) -> Any:
    """The garbage collector's settings in the worker's process, as the handler sees them."""
    return {"threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count()}
