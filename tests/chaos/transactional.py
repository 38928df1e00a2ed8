"""Transactional mode in a chaos run: the effect is a row committed with the completion.

``--store postgres-tx`` runs the PostgreSQL store with ``SEMEL_TRANSACTIONAL``
and ``tests.chaos.ledger:handle_in_transaction``, whose effect is a row of
``chaos_effects`` written in the key's own transaction. An effect there
exists only if its transaction committed, and it commits together with the
key's completion, so no fault may leave two effects for one key: this mode
fails on any duplicate effect, explained or not.
"""

from __future__ import annotations

from typing import Any

import psycopg

from tests.chaos.ledger import EFFECTS_TABLE, Run

TRANSACTIONAL = "postgres-tx"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE} (
    id      bigserial PRIMARY KEY,
    key     text             NOT NULL,
    fence   bigint           NOT NULL,
    attempt integer          NOT NULL,
    pid     integer          NOT NULL,
    at      double precision NOT NULL
)
"""


def server_kind(store: str) -> str:
    """The store server a mode runs on."""
    return "postgres" if store == TRANSACTIONAL else store


def mode_settings(store: str) -> dict[str, Any]:
    if store != TRANSACTIONAL:
        return {}
    return {"transactional": True, "handler": "tests.chaos.ledger:handle_in_transaction"}


async def create_effects_table(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(SCHEMA)


async def committed_effects(dsn: str, runs: list[Run]) -> list[Run]:
    """The ledger's executions, each with the time of its committed effect, if any."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(f"SELECT key, fence, pid, at FROM {EFFECTS_TABLE}")
        committed = {(key, fence, pid): at for key, fence, pid, at in await cursor.fetchall()}
    merged = []
    for run in runs:
        at = committed.pop((run.key, run.fence, run.pid), None)
        merged.append(Run(run.key, run.fence, run.attempt, run.pid, run.started, at, run.ended,
                          run.outcome))  # fmt: skip
    # A committed effect the ledger never saw start would be a bug of the run itself.
    for (key, fence, pid), at in committed.items():
        merged.append(Run(key, fence, 0, pid, at, at, None, "unrecorded"))
    return merged
