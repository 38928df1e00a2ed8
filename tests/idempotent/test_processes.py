"""The proof, across OS processes on Redis and PostgreSQL: callers of one key at
once leave exactly one effect, and a caller SIGKILLed in the middle of the
function is taken over after its lease under a higher fence, still with one
completed effect. The effects are counted in a ledger on the store's server."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import uuid
from collections.abc import AsyncIterator

import orjson
import pytest

from semel.settings import Settings
from semel.stores.base import Status
from tests.conftest import SettingsFactory, open_store
from tests.idempotent.ledger import Entry, open_ledger
from tests.servers import ROOT

pytestmark = [
    pytest.mark.parametrize("backend", ["redis", "postgres"], indirect=True),
    pytest.mark.timeout(120),
]

CALLERS = 4
# The killed caller's lease: long enough that the heir, released just before the
# kill, meets it in progress rather than lapsed.
KILL_LEASE = 3.0
LINE_WAIT = 60.0  # seconds a process gets to start, or to answer


class Caller:
    """``tests.idempotent.caller`` in a process of its own."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, settings: Settings, key: str, mode: str) -> Caller:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.idempotent.caller",
            settings.model_dump_json(),
            key,
            mode,
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def line(self) -> str:
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), LINE_WAIT)
        assert raw, f"the caller ended (exit {await self.process.wait()})"
        return raw.decode().strip()

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")

    async def result(self) -> dict[str, int]:
        line = await self.line()
        assert line.startswith("result "), line
        assert await asyncio.wait_for(self.process.wait(), LINE_WAIT) == 0
        answer: dict[str, int] = orjson.loads(line.removeprefix("result "))
        return answer


@contextlib.asynccontextmanager
async def callers() -> AsyncIterator[list[Caller]]:
    started: list[Caller] = []
    try:
        yield started
    finally:
        for caller in started:
            if caller.process.returncode is None:
                caller.process.kill()
                await caller.process.wait()


async def ledger_of(settings: Settings) -> list[Entry]:
    ledger = await open_ledger(settings)
    try:
        entries = await ledger.entries()
        await ledger.drop()
        return entries
    finally:
        await ledger.close()


async def made_ledger(settings: Settings) -> None:
    """The ledger made before the callers start: PostgreSQL's CREATE TABLE IF NOT
    EXISTS is not safe to race (two creators can both miss the table, and one
    fails on pg_type's unique index; seen once in CI)."""
    ledger = await open_ledger(settings)
    await ledger.close()


async def run_together(settings: Settings, key: str, mode: str) -> list[dict[str, int]]:
    await made_ledger(settings)
    async with callers() as started:
        for _ in range(CALLERS):
            started.append(await Caller.start(settings, key, mode))
        for caller in started:
            assert await caller.line() == "ready"
        for caller in started:  # every process has its store open: released together
            caller.go()
        return [await caller.result() for caller in started]


def steps(entries: list[Entry], step: str) -> list[Entry]:
    return [entry for entry in entries if entry["step"] == step]


async def test_callers_in_several_processes_leave_one_effect(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings()
    answers = await run_together(settings, "o-1", "run")
    entries = await ledger_of(settings)
    (charged,) = steps(entries, "charged")
    assert len(steps(entries, "started")) == 1
    assert answers == [{"fence": charged["fence"], "pid": charged["pid"]}] * CALLERS


async def test_the_proof_catches_callers_that_are_not_guarded(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings()
    await run_together(settings, "o-2", "unguarded")
    assert len(steps(await ledger_of(settings), "charged")) == CALLERS


async def test_a_caller_killed_mid_call_is_taken_over_under_a_higher_fence(
    make_settings: SettingsFactory,
) -> None:
    """The heir calls while the doomed caller holds the key, and is still waiting
    when the doomed one is killed: at least two thirds of the lease are left then."""
    settings = make_settings(lock_ttl=KILL_LEASE)
    key = f"o-{uuid.uuid4().hex[:6]}"
    async with callers() as started:
        await made_ledger(settings)
        doomed = await Caller.start(settings, key, "hang")
        heir = await Caller.start(settings, key, "run")
        started += [doomed, heir]
        assert [await doomed.line(), await heir.line()] == ["ready", "ready"]
        doomed.go()
        line = await doomed.line()
        assert line.startswith("started "), line
        dead_fence = int(line.removeprefix("started "))
        heir.go()  # meets the key in progress, and waits
        doomed.process.send_signal(signal.SIGKILL)
        assert await doomed.process.wait() == -signal.SIGKILL
        answer = await heir.result()
    assert answer["fence"] > dead_fence
    entries = await ledger_of(settings)
    assert [e["fence"] for e in steps(entries, "started")] == [dead_fence, answer["fence"]]
    (charged,) = steps(entries, "charged")
    assert charged["fence"] == answer["fence"]
    store = await open_store(settings)
    try:
        record = await store.get(f"charge:{key}")
    finally:
        await store.close()
    assert record is not None
    assert (record.status, record.fence) == (Status.COMPLETED, answer["fence"])
