"""Rounds of consumer processes that SIGKILL themselves at a chosen step, then a
clean run, then the count: business rows per key and messages that came out.

Each round publishes fresh keys (and second copies of some), starts
``python -m semel`` with one kill point armed, and waits for it to die. Keys
left claimed by a dead process come back once their lease runs out, so every
round also replays earlier rounds' unfinished work under new kills.
"""

from __future__ import annotations

import signal
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql

from semel.settings import Settings
from semel.stores.base import Status
from semel.stores.postgres.transactional import TransactionalStore
from tests.consumer.handlers import ALLOW_DIE_ENV
from tests.consumer.harness import Broker, ConsumerProcess, eventually, processes
from tests.transactional.conftest import Downstream
from tests.transactional.handlers import KILL_AT_ENV

ROUND_DEADLINE = 30.0  # seconds a process gets to reach its kill point
DRAIN_DEADLINE = 60.0  # seconds the clean run gets to finish everything


@dataclass
class Plan:
    steps: tuple[str, ...]
    kills_per_step: int
    keys_per_round: int
    business_table: str
    handler_sleep: float = 0.05


@dataclass
class Report:
    keys: int = 0
    copies_published: int = 0  # incoming messages, second copies included
    kills: Counter[str] = field(default_factory=Counter)
    rows_per_key: dict[str, int] = field(default_factory=dict)
    ids_per_key: dict[str, set[str]] = field(default_factory=dict)
    delivered: int = 0  # outgoing copies that reached the queue, duplicates included
    outbox_rows: int = 0
    unsent: int = 0

    @property
    def business_rows(self) -> int:
        return sum(self.rows_per_key.values())

    @property
    def distinct_messages(self) -> int:
        return sum(len(ids) for ids in self.ids_per_key.values())

    @property
    def duplicate_copies(self) -> int:
        return self.delivered - self.distinct_messages

    def problems(self, keys: list[str]) -> list[str]:
        """Every way the outcome differs from "exactly once per key"."""
        found = []
        for key in keys:
            rows, ids = self.rows_per_key.get(key, 0), self.ids_per_key.get(key, set())
            if rows != 1:
                found.append(f"{key}: {rows} business rows")
            if len(ids) != 1:
                found.append(f"{key}: {len(ids)} distinct outgoing messages")
        if self.outbox_rows != len(keys) or self.unsent:
            found.append(f"outbox: {self.outbox_rows} rows, {self.unsent} unsent")
        return found

    def summary(self) -> str:
        kills = ", ".join(f"{step} {n}" for step, n in self.kills.items())
        return (
            f"keys {self.keys} (incoming copies {self.copies_published}); kills: {kills}; "
            f"business rows {self.business_rows}; outgoing messages {self.distinct_messages} "
            f"distinct, {self.delivered} delivered, {self.duplicate_copies} duplicate copies "
            f"dropped by id"
        )


async def run_rounds(
    plan: Plan,
    settings: Settings,
    broker: Broker,
    downstream: Downstream,
    store: TransactionalStore,
    log: Path,
) -> Report:
    report = Report()
    keys: list[str] = []
    await broker.declare(settings)
    with processes() as started:
        for step in plan.steps:
            for _ in range(plan.kills_per_step):
                fresh = [f"order-{len(keys) + i}" for i in range(plan.keys_per_round)]
                keys += fresh
                report.copies_published += await publish(plan, settings, broker, downstream, fresh)
                env = {KILL_AT_ENV: step, ALLOW_DIE_ENV: "1"}
                worker = ConsumerProcess(settings, log, **env).start()
                started.append(worker)
                await eventually(partial(_exited, worker), ROUND_DEADLINE, f"a kill at {step}")
                assert worker.exited() == -signal.SIGKILL, worker.output()[-3000:]
                report.kills[step] += 1
        clean = ConsumerProcess(settings, log).start()
        started.append(clean)
        await eventually(
            partial(_all_done, store, keys), DRAIN_DEADLINE, "every key completed and relayed"
        )
        clean.signal(signal.SIGTERM)
        assert await clean.wait(30) == 0, clean.output()[-3000:]
    report.keys = len(keys)
    await count(report, plan, settings, downstream, store)
    return report


async def _exited(worker: ConsumerProcess) -> bool:
    return worker.exited() is not None


async def publish(
    plan: Plan, settings: Settings, broker: Broker, downstream: Downstream, keys: list[str]
) -> int:
    copies = 0
    for n, key in enumerate(keys):
        body: dict[str, Any] = {"table": plan.business_table, "exchange": downstream.exchange}
        body["sleep"] = plan.handler_sleep
        # Every other key twice: a duplicate while the first is queued or running.
        for _ in range(2 if n % 2 == 0 else 1):
            await broker.publish(settings, body, key=key)
            copies += 1
    return copies


async def _all_done(store: TransactionalStore, keys: list[str]) -> bool:
    for key in keys:
        record = await store.get(key)
        if record is None or record.status is not Status.COMPLETED:
            return False
    return await store.unsent() == 0


async def count(
    report: Report,
    plan: Plan,
    settings: Settings,
    downstream: Downstream,
    store: TransactionalStore,
) -> None:
    async with await psycopg.AsyncConnection.connect(settings.postgres_dsn) as conn:
        by_key = sql.SQL("SELECT key, count(*) FROM {} GROUP BY key")
        cur = await conn.execute(by_key.format(sql.Identifier(plan.business_table)))
        report.rows_per_key = {key: n for key, n in await cur.fetchall()}
        outbox = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(settings.outbox_table))
        row = await (await conn.execute(outbox)).fetchone()
        report.outbox_rows = int(row[0]) if row else 0
    report.unsent = await store.unsent()
    ids: dict[str, set[str]] = defaultdict(set)
    for message in await downstream.drain(settle=1.0):
        body: dict[str, Any] = orjson.loads(message.body)
        assert message.message_id is not None
        assert message.headers["Idempotency-Key"] == message.message_id
        ids[body["key"]].add(message.message_id)
        report.delivered += 1
    report.ids_per_key = dict(ids)


def fail_unless_exactly_once(report: Report, keys: int) -> None:
    problems = report.problems([f"order-{i}" for i in range(keys)])
    if problems:
        pytest.fail(f"{len(problems)} problems: {problems[:10]}; {report.summary()}")
