"""A plain (thread) handler whose lease cannot be kept never acts beside the new owner.

A thread cannot be cancelled, so the worker running it exits instead, before
the lease lapses at the store, and the thread dies with it. Real ``semel
consume`` processes: worker A reaches the store through a proxy that is then
stalled (packets dropped, no reset, no answer); worker B reaches it directly
and takes the key over once A's lease has lapsed.
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from semel.stores.base import Status, Store
from semel.stores.errors import EXIT_LEASE_LOST
from tests.consumer.conftest import KEPT_LEASE, ConsumerSettings
from tests.consumer.handlers import LEDGER_ENV, read_ledger
from tests.consumer.harness import Broker, ConsumerProcess, TcpProxy, eventually, processes
from tests.consumer.test_delivery import status_is
from tests.consumer.test_faults import through_proxy
from tests.servers import free_port

pytestmark = pytest.mark.timeout(120)

HELD = "held"


@pytest.mark.parametrize("backend", ["postgres", "redis"])
async def test_a_thread_whose_store_goes_silent_dies_with_its_process_before_its_lease_lapses(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    ledger: Path,
    tmp_path: Path,
) -> None:
    base = consumer_settings()
    port = free_port()
    target, through = through_proxy(base, port)
    proxy = await TcpProxy(target, port).start()
    common: dict[str, Any] = {
        "handler": "tests.consumer.handlers:blocking",
        "lock_ttl": KEPT_LEASE,
        "handler_timeout": 60.0,
    }
    a_settings = consumer_settings(**common, **through)
    b_settings = consumer_settings(**common)
    await broker.declare(a_settings)
    # Longer than A could keep its lease once the link is silent.
    await broker.publish(a_settings, {"sleep": 4 * KEPT_LEASE}, key=HELD)
    try:
        with processes() as started:
            a = ConsumerProcess(a_settings, tmp_path / "a.log", **{LEDGER_ENV: str(ledger)})
            a.start()
            started.append(a)

            def runs_by(pid: int) -> list[dict[str, Any]]:
                return [e for e in read_ledger(ledger) if e["key"] == HELD and e["pid"] == pid]

            async def a_running() -> bool:
                return bool(runs_by(a.pid))

            await eventually(a_running, 20, "A running 'held'")
            b = ConsumerProcess(b_settings, tmp_path / "b.log", **{LEDGER_ENV: str(ledger)})
            b.start()
            started.append(b)

            async def b_attached() -> bool:
                return await broker.consumers(a_settings.queue) >= 2

            await eventually(b_attached, 20, "B attached next to A")
            # A's lease was last renewed before this instant, so it lapses at the
            # store by KEPT_LEASE after it at the latest.
            stalled_at = time.time()
            proxy.stall()
            try:
                await a.wait(3 * KEPT_LEASE)
                a_gone = time.time()  # polled: no earlier than the real exit
            except pytest.fail.Exception:  # seen on the old code: the thread ran on
                a_gone = math.inf

            async def b_ran() -> bool:
                return any(e["event"] == "end" for e in runs_by(b.pid))

            await eventually(b_ran, 30, f"B ran 'held'; B: {b.output()}")

            async def a_run_over() -> bool:  # its thread ended, or died with its process
                return a.exited() is not None or len(runs_by(a.pid)) == 2

            await eventually(a_run_over, 6 * KEPT_LEASE, "A's run over")
            b.signal(signal.SIGTERM)
            assert await b.wait() == 0, b.output()
    finally:
        await proxy.close()

    a_runs, b_runs = runs_by(a.pid), runs_by(b.pid)
    b_start = min(e["t"] for e in b_runs if e["event"] == "start")
    a_ends = [e["t"] for e in a_runs if e["event"] == "end"]
    assert not a_ends, f"A's thread wrote its effect {a_ends[0] - b_start:.2f}s after B started"
    assert a.exited() == EXIT_LEASE_LOST, a.output()
    assert a_gone - stalled_at <= KEPT_LEASE, f"A exited {a_gone - stalled_at:.2f}s after the stall"
    assert b_start >= a_gone - 0.1, (a_runs, b_runs, a_gone)
    (line,) = [ln for ln in a.output().splitlines() if "error" in ln]
    assert HELD in line, line
    assert "lease" in line, line
    assert max(e["fence"] for e in b_runs) > a_runs[0]["fence"]
    assert await status_is(store, HELD, Status.COMPLETED)


@pytest.mark.parametrize("backend", ["postgres"])
async def test_a_thread_whose_key_was_taken_over_dies_with_its_process_at_the_next_renewal(
    consumer_settings: ConsumerSettings, broker: Broker, store: Store, ledger: Path, tmp_path: Path
) -> None:
    settings = consumer_settings(
        handler="tests.consumer.handlers:blocking", lock_ttl=3.0, handler_timeout=60.0
    )
    await broker.declare(settings)
    await broker.publish(settings, {"sleep": 20}, key=HELD)
    with processes() as started:
        a = ConsumerProcess(settings, tmp_path / "a.log", **{LEDGER_ENV: str(ledger)})
        a.start()
        started.append(a)

        async def a_running() -> bool:
            return bool(read_ledger(ledger))

        await eventually(a_running, 20, "A running 'held'")
        # What another worker's takeover leaves in the row: a higher fence, a fresh lease.
        async with await psycopg.AsyncConnection.connect(
            settings.postgres_dsn, autocommit=True
        ) as conn:
            await conn.execute(
                sql.SQL(
                    "UPDATE {} SET fence = fence + 1, lock_expires_at = now() + interval '60 s' "
                    "WHERE key = %s"
                ).format(sql.Identifier(settings.postgres_table)),
                (store.config.namespaced(HELD),),
            )
        taken_at = time.time()
        # The next renewal (a third of the lease later at most) hears of it.
        assert await a.wait(3.0) == EXIT_LEASE_LOST, a.output()
        assert time.time() - taken_at <= 3.0 / 3 + 0.5
    assert [e["event"] for e in read_ledger(ledger)] == ["start"]  # never ran on
    (line,) = [ln for ln in a.output().splitlines() if "error" in ln]
    assert HELD in line, line
    assert "taken over" in line, line
