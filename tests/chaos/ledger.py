"""The chaos run's handler and its side-effect ledger.

``SEMEL_HANDLER=tests.chaos.ledger:handle``. Every execution is a row of a
SQLite file (WAL mode, on the local disk, named by ``SEMEL_CHAOS_LEDGER``):
inserted when the handler starts, stamped when it performs its one side
effect, stamped again when it returns. The ledger is independent of the store
under test, so its outages and restarts cannot hide an execution.

The side effect *is* the ``effect`` stamp: a key with two stamped rows had its
effect done twice. The stamp is a synchronous write inside the async handler
on purpose: a cancellation cannot split it, so a stamped row is an effect that
happened and an unstamped one is an effect that did not.

In transactional mode (``handle_in_transaction``) the effect is instead a
row of ``chaos_effects`` written through ``context.db``, the key's own
PostgreSQL transaction: it counts only if it committed, with the completion.
The ledger still records every execution, and its stamp every attempt.

``handle_sync`` is the same handler as a plain ``def``, run on a thread of
its own: the rolling-restart run (``tests.chaos.faults``) uses it, since a
thread cannot be cancelled and so outlives a shutdown's grace.

The message body drives the handler: ``work_ms`` of work with the effect at
the ``effect_at`` fraction of it; ``fail`` = ``"transient"`` (fails on the
first attempt), ``"always"`` (fails every attempt) or ``"permanent"``
(``PermanentError``), each before the effect.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semel.consumer import Context, PermanentError

LEDGER_ENV = "SEMEL_CHAOS_LEDGER"
EFFECTS_TABLE = "chaos_effects"  # transactional mode: effects committed with their key
BUSY_TIMEOUT = 30.0  # seconds; several worker processes append at once

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id       INTEGER PRIMARY KEY,
    key      TEXT    NOT NULL,
    fence    INTEGER NOT NULL,
    attempt  INTEGER NOT NULL,
    pid      INTEGER NOT NULL,
    started  REAL    NOT NULL,
    effect   REAL,
    ended    REAL,
    outcome  TEXT
)
"""

# One connection per thread: a plain handler's thread may not use another's.
_connections = threading.local()


def connect(path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    # A SIGKILL loses nothing the OS already has; only a power cut would need FULL.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(SCHEMA)
    return conn


def _ledger() -> sqlite3.Connection:
    connection: sqlite3.Connection | None = getattr(_connections, "ledger", None)
    if connection is None:
        connection = _connections.ledger = connect(os.environ[LEDGER_ENV])
    return connection


def _begin(context: Context) -> int:
    cursor = _ledger().execute(
        "INSERT INTO runs (key, fence, attempt, pid, started) VALUES (?, ?, ?, ?, ?)",
        (context.key, context.fence, context.attempt, os.getpid(), time.time()),
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _effect(run_id: int) -> None:
    _ledger().execute("UPDATE runs SET effect = ? WHERE id = ?", (time.time(), run_id))


def _end(run_id: int, outcome: str) -> None:
    _ledger().execute(
        "UPDATE runs SET ended = ?, outcome = ? WHERE id = ?", (time.time(), outcome, run_id)
    )


Effect = Callable[[Context, int], Awaitable[None]]


async def _stamp(context: Context, run_id: int) -> None:
    _effect(run_id)


async def _in_transaction(context: Context, run_id: int) -> None:
    # Transactional mode: the effect is a row written in the key's own
    # transaction, committed together with the completion or not at all.
    db: Any = getattr(context, "db")  # noqa: B009 - only the transactional context has it
    await db.execute(
        f"INSERT INTO {EFFECTS_TABLE} (key, fence, attempt, pid, at) VALUES (%s, %s, %s, %s, %s)",
        (context.key, context.fence, context.attempt, os.getpid(), time.time()),
    )
    _effect(run_id)  # in the ledger: attempted, committed or not


def _timing(context: Context) -> tuple[float, float]:
    """Seconds of work before and after the effect, as the body asks."""
    work = float(context.body.get("work_ms", 10)) / 1000
    before = work * float(context.body.get("effect_at", 0.5))
    return before, work - before


def _fail_if_asked(context: Context) -> None:
    fail = context.body.get("fail")
    if fail == "permanent":
        raise PermanentError("this order can never be paid")
    if fail == "always" or (fail == "transient" and context.attempt == 1):
        raise RuntimeError(f"payment gateway timed out on attempt {context.attempt}")


def _result(context: Context) -> dict[str, Any]:
    return {"fence": context.fence, "pid": os.getpid()}


async def _work(context: Context, run_id: int, effect: Effect) -> Any:
    before, after = _timing(context)
    await asyncio.sleep(before)
    _fail_if_asked(context)
    await effect(context, run_id)
    await asyncio.sleep(after)
    return _result(context)


def handle_sync(context: Context) -> Any:
    """The chaos handler as a plain ``def``: the same work, blocking its thread."""
    run_id = _begin(context)
    outcome = "cancelled"  # a thread is never cancelled: left only if its process dies
    try:
        before, after = _timing(context)
        time.sleep(before)
        _fail_if_asked(context)
        _effect(run_id)
        time.sleep(after)
        outcome = "returned"
        return _result(context)
    except Exception:
        outcome = "raised"
        raise
    finally:
        _end(run_id, outcome)


async def handle(context: Context) -> Any:
    """The chaos handler: its effect is the ledger stamp."""
    return await _run(context, _stamp)


async def handle_in_transaction(context: Context) -> Any:
    """The chaos handler in transactional mode: its effect is a row in the store's database."""
    return await _run(context, _in_transaction)


async def _run(context: Context, effect: Effect) -> Any:
    run_id = _begin(context)
    outcome = "cancelled"  # what a cancellation (lease lost, shutdown) leaves
    try:
        result = await _work(context, run_id, effect)
        outcome = "returned"
        return result
    except Exception:
        outcome = "raised"
        raise
    finally:
        _end(run_id, outcome)
        # Each execution has a thread of its own: its connection ends with it.
        _connections.__dict__.pop("ledger").close()


@dataclass(frozen=True, slots=True)
class Run:
    """One execution as the ledger recorded it (wall-clock seconds)."""

    key: str
    fence: int
    attempt: int
    pid: int
    started: float
    effect: float | None
    ended: float | None
    outcome: str | None


def read_runs(path: str | Path) -> list[Run]:
    if not Path(path).exists():
        return []
    conn = connect(path)
    try:
        rows = conn.execute(
            "SELECT key, fence, attempt, pid, started, effect, ended, outcome FROM runs ORDER BY id"
        ).fetchall()
    finally:
        conn.close()
    return [Run(*row) for row in rows]


def in_flight(conn: sqlite3.Connection, pid: int, *, after_effect: bool) -> int:
    """Executions of ``pid`` running now; ``after_effect``: only those past their effect."""
    condition = "effect IS NOT NULL" if after_effect else "1"
    query = f"SELECT count(*) FROM runs WHERE pid = ? AND ended IS NULL AND {condition}"
    count: int = conn.execute(query, (pid,)).fetchone()[0]
    return count
