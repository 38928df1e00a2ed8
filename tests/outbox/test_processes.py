"""``semel relay`` as real processes: several of them under concurrent commits from
several processes publish every committed message once, none rolled back, in each
group's causal order with ``per-key``; SIGTERM ends each with exit code 0."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql
from yarl import URL

from semel import Semel
from semel.settings import Settings
from tests.conftest import SettingsFactory, settings_env
from tests.consumer.harness import Broker, ConsumerProcess, processes
from tests.outbox.conftest import count_rows, eventually, received, stage_one
from tests.proxy import TcpProxy
from tests.servers import ROOT, free_port
from tests.transactional.conftest import Downstream

pytestmark = pytest.mark.timeout(180)

STAGERS = 3
RELAYS = 3
PER_STAGER = 100  # transactions; every fifth rolls back
GROUPS = 4
BACKLOG = 150  # rows committed before the relays start: more than one batch


def relay_process(settings: Settings, log: Path) -> ConsumerProcess:
    process = ConsumerProcess(settings, log)
    with log.open("ab") as out:
        process.proc = subprocess.Popen(
            [sys.executable, "-m", "semel", "relay"],
            env=process.env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return process


def running(relay: ConsumerProcess) -> Callable[[], Awaitable[bool]]:
    """Whether ``relay`` says it relays: it stops on SIGTERM from then on."""

    async def check() -> bool:
        return "relaying" in relay.output()

    return check


async def run_stagers(settings: Settings, prefix: str) -> list[list[Any]]:
    """``STAGERS`` processes committing at once; what each says it committed."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.outbox.stager", settings.postgres_dsn,
            settings.outbox_table, settings.exchange, prefix, str(PER_STAGER), str(GROUPS),
            cwd=ROOT, env=settings_env(settings), stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(STAGERS)
    ]  # fmt: skip
    outputs = await asyncio.gather(*(asyncio.wait_for(p.communicate(), 90) for p in procs))
    assert [p.returncode for p in procs] == [0] * STAGERS
    return [orjson.loads(line) for out, _ in outputs for line in out.splitlines()]


@pytest.mark.parametrize("ordering", ["oldest-first", "per-key"])
async def test_several_relays_publish_each_committed_message_once(
    ordering: str,
    outbox_settings: SettingsFactory,
    db: psycopg.AsyncConnection[Any],
    table: str,
    downstream: Downstream,
    run_id: str,
    tmp_path: Path,
) -> None:
    settings = outbox_settings(outbox_ordering=ordering)
    with processes() as relays:
        # The relays start on a backlog (each first pass can take a batch holding
        # every group) while the commits go on.
        staging = asyncio.create_task(run_stagers(settings, run_id))

        async def backlog() -> bool:
            return await count_rows(db, table) >= BACKLOG

        await eventually(backlog, 60.0, "a backlog of committed rows", step=0.05)
        for n in range(RELAYS):
            relays.append(relay_process(settings, tmp_path / f"relay{n}.log"))
        committed = await staging
        assert len(committed) == STAGERS * PER_STAGER * 4 // 5
        messages = await received(downstream, len(committed), within=60.0)
        messages += await downstream.drain(settle=1.0)  # any second copy
        for relay in relays:  # one still starting up would die of SIGTERM itself
            await eventually(running(relay), 60.0, "every relay running")
        for relay in relays:
            relay.signal(signal.SIGTERM)
        codes = [await relay.wait(30) for relay in relays]
        logs = "\n".join(relay.output() for relay in relays)
    assert codes == [0] * RELAYS, logs
    copies = Counter(m.message_id for m in messages)
    assert set(copies) == {message_id for _, _, message_id in committed}  # none rolled back
    assert set(copies.values()) == {1}, [i for i, n in copies.items() if n > 1]
    if ordering != "per-key":
        return
    arrived: defaultdict[str, list[int]] = defaultdict(list)
    for message in messages:
        body = orjson.loads(message.body)
        arrived[body["group"]].append(body["seq"])
    for group, seqs in arrived.items():
        assert seqs == sorted(seqs), f"{group} arrived out of order: {seqs}"


async def test_semel_relay_publishes_and_stops_on_sigterm(
    outbox_settings: SettingsFactory, table: str, downstream: Downstream, tmp_path: Path
) -> None:
    settings = outbox_settings()
    with processes() as started:
        relay = relay_process(settings, tmp_path / "relay.log")
        started.append(relay)
        message_id = await stage_one(settings.postgres_dsn, Semel(settings).outbox, "k")
        [message] = await received(downstream, 1, within=20.0)
        relay.signal(signal.SIGTERM)
        assert await relay.wait(30) == 0, relay.output()
    assert message.message_id == message_id


async def test_semel_relay_stops_in_time_with_its_servers_stalled(
    outbox_settings: SettingsFactory, table: str, tmp_path: Path
) -> None:
    """PostgreSQL and the broker stop answering, connections open: the relay's pass,
    the closes of its channel, pool and connection would each wait on them. Each
    is cut short in its time, naming itself, and SIGTERM still ends the relay."""
    settings = outbox_settings()
    dsn, amqp = URL(settings.postgres_dsn), URL(settings.amqp_url)
    postgres = await TcpProxy(dsn.port or 5432, free_port()).start()
    broker = await TcpProxy(amqp.port or 5672, free_port()).start()
    stalled = outbox_settings(
        postgres_dsn=str(dsn.with_host("127.0.0.1").with_port(postgres.port)),
        amqp_url=str(amqp.with_host("127.0.0.1").with_port(broker.port)),
    )
    try:
        with processes() as started:
            relay = relay_process(stalled, tmp_path / "relay.log")
            started.append(relay)
            await eventually(running(relay), 60.0, "the relay running")
            await asyncio.sleep(0.5)  # its first pass is over
            postgres.stall()
            broker.stall()
            await asyncio.sleep(1.5)  # a sweep is under way, stuck on the database
            relay.signal(signal.SIGTERM)
            assert await relay.wait(30) == 0, relay.output()
            steps = [line for line in relay.output().splitlines() if "cut short" in line]
        assert any("the outbox relay's pass" in line for line in steps), steps
    finally:
        await postgres.close()
        await broker.close()


async def test_semel_relay_without_its_table_says_how_to_fix_it(
    outbox_settings: SettingsFactory, run_id: str, tmp_path: Path
) -> None:
    settings = outbox_settings(outbox_table=f"t_{run_id}_missing")
    with processes() as started:
        relay = relay_process(settings, tmp_path / "relay.log")
        started.append(relay)
        assert await relay.wait(30) == 2
        errors = [line for line in relay.output().splitlines() if "semel: error" in line]
    assert len(errors) == 1
    assert "run `semel migrate`" in errors[0]


async def test_migrate_makes_the_outbox_table_with_the_postgres_store(
    outbox_settings: SettingsFactory, db: psycopg.AsyncConnection[Any], run_id: str
) -> None:
    settings = outbox_settings(outbox_table=f"t_{run_id}_migrated")
    try:
        done = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "semel", "migrate", cwd=ROOT, env=settings_env(settings),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(done.communicate(), 60)
        assert done.returncode == 0, err.decode()
        assert await count_rows(db, settings.outbox_table) == 0  # it exists
    finally:
        for name in (settings.outbox_table, settings.postgres_table):
            await db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


async def test_semel_consume_relays_when_asked(
    outbox_settings: SettingsFactory,
    table: str,
    downstream: Downstream,
    db: psycopg.AsyncConnection[Any],
    run_id: str,
    tmp_path: Path,
) -> None:
    settings = outbox_settings(outbox_relay=True, exchange=f"t.{run_id}.events")
    broker = await Broker.connect(settings.amqp_url)
    try:
        with processes() as started:
            consumer = ConsumerProcess(settings, tmp_path / "consume.log").start()
            started.append(consumer)
            writer = Semel(settings).outbox
            message_id = await stage_one(
                settings.postgres_dsn, writer, "k", exchange=downstream.exchange
            )
            [message] = await received(downstream, 1, within=30.0)
            consumer.signal(signal.SIGTERM)
            assert await consumer.wait(30) == 0, consumer.output()
        assert message.message_id == message_id
    finally:
        await broker.delete_topology(settings)
        await broker.close()
        await db.execute(
            sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(settings.postgres_table))
        )
