"""The downstream consumer's handler: the chaos ledger's, plus each execution's message id.

``SEMEL_HANDLER=tests.outbox_chaos.ledger:handle``. Every execution is
recorded by :mod:`tests.chaos.ledger` (its effect stamped, so duplicate
effects are counted and explained by the same rules); the message id it ran
under goes to a table of its own in the same SQLite file, so the verdict can
tell a key published under a second message id from a redelivery.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from semel.consumer import Context
from tests.chaos import ledger
from tests.chaos.ledger import LEDGER_ENV, connect

SCHEMA = """
CREATE TABLE IF NOT EXISTS seen (
    key        TEXT NOT NULL,
    message_id TEXT,
    pid        INTEGER NOT NULL,
    at         REAL NOT NULL
)
"""


def _record(context: Context) -> None:
    conn = connect(os.environ[LEDGER_ENV])
    try:
        conn.execute(SCHEMA)
        conn.execute(
            "INSERT INTO seen (key, message_id, pid, at) VALUES (?, ?, ?, ?)",
            (context.key, context.message_id, os.getpid(), time.time()),
        )
    finally:
        conn.close()


async def handle(context: Context) -> Any:
    """Record the message id, then run the chaos ledger's handler (its effect stamped)."""
    _record(context)
    return await ledger.handle(context)


def message_ids(path: str | Path) -> dict[str, set[str]]:
    """Key -> every message id an execution of it ran under."""
    found: dict[str, set[str]] = {}
    conn = connect(path)
    try:
        conn.execute(SCHEMA)
        rows = conn.execute("SELECT key, message_id FROM seen").fetchall()
    except sqlite3.Error:
        return found
    finally:
        conn.close()
    for key, message_id in rows:
        found.setdefault(key, set()).add(message_id or "")
    return found
