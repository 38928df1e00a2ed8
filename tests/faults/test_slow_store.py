"""A slow store never lets a live worker's lease lapse.

Three worker processes share a queue and reach the store through a proxy
that holds every chunk for a while each way. No worker dies and the store
always answers, only late; a full prefetch window's store calls then take
longer than a lease unless a worker holds back. The required result is the
plain one: every key's handler ran to its effect exactly once (a second
effect is a duplicate), nothing lost, nothing dead-lettered, within a
deadline, however the workers pace themselves (handing messages back,
pausing, conflict retries are all allowed); and no lease lapses at all: no
run is cut short for a renewal that came too late and run again.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from semel.consumer.names import Topology
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.handlers import LEDGER_ENV, read_ledger
from tests.consumer.harness import Broker, ConsumerProcess, TcpProxy, processes
from tests.consumer.test_delivery import finished, settle_all
from tests.consumer.test_faults import through_proxy
from tests.servers import free_port

# SEMEL_LOCK_TTL: a heartbeat every 1.7 s, so only a worker held up for more
# than 3 s misses two in a row. At 3 s, a CI run alone on the machine once saw
# one worker's burst of ten keys lapse: a stall of the host, not a late renewal.
LEASE = 5.0
PREFETCH = 256
DELAY = 0.05  # seconds the proxy holds each chunk, each way: a store 100 ms away
WORKERS = 3
KEYS = 300
COPIES = 60  # keys published twice: the second copy must be a duplicate, never a run
RUN_FOR = 6.0  # each run outlives its lease: only renewals keep the key its own
DEADLINE = 90.0  # seconds for every key to be completed

pytestmark = pytest.mark.timeout(DEADLINE + 90)


def runs(ledger: Path) -> tuple[Counter[str], Counter[str]]:
    """Handler runs started and ended, per key."""
    started: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    for event in read_ledger(ledger):
        (started if event["event"] == "start" else ended)[event["key"]] += 1
    return started, ended


@pytest.mark.parametrize("backend", ["postgres", "redis", "dynamodb-moto"])
async def test_a_slow_store_never_lets_a_live_workers_lease_lapse(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    ledger: Path,
    start_consumer: StartConsumer,
) -> None:
    base = consumer_settings()
    port = free_port()
    target, through = through_proxy(base, port)
    proxy = await TcpProxy(target, port, delay=DELAY).start()
    settings = consumer_settings(
        **through, lock_ttl=LEASE, prefetch=PREFETCH, handler_timeout=60.0, max_attempts=5
    )
    keys = [f"k{i}" for i in range(KEYS)]
    dlq = Topology(settings.queue).dead_letter_queue
    try:
        await broker.declare(settings)
        for key in [*keys, *keys[:COPIES]]:
            await broker.publish(settings, {"sleep": RUN_FOR}, key=key)
        with processes() as workers:
            started = time.monotonic()
            for i in range(WORKERS):
                log = ledger.with_name(f"worker-{i}.log")
                env = {LEDGER_ENV: str(ledger)}
                workers.append(ConsumerProcess(settings, log, **env).start())
            end = started + DEADLINE
            while len(ended := runs(ledger)[1]) < KEYS:
                # A dead letter is final: no need to wait for the deadline to fail.
                if time.monotonic() > end or await broker.depth(dlq) > 0:
                    starts = runs(ledger)[0]
                    letters = Counter(
                        letter.reason for letter in await broker.dead_letters(settings)
                    )
                    pytest.fail(
                        f"after {time.monotonic() - started:.0f}s (deadline {DEADLINE:g}s): "
                        f"{len(ended)}/{KEYS} keys completed, {sum(starts.values())} runs "
                        f"started, {_twice(starts)} keys run more than once, dead letters "
                        f"{dict(letters)}; queues {await broker.depths(settings)}",
                        pytrace=False,
                    )
                await asyncio.sleep(0.5)
            took = time.monotonic() - started
            for worker in workers:
                worker.signal(signal.SIGTERM)
            for worker in workers:
                assert await worker.wait() == 0, worker.output()[-2000:]
    finally:
        await proxy.cut()
    print(
        f"\n{settings.store.value}: {KEYS} keys + {COPIES} copies through a {DELAY:g}s proxy, "
        f"{WORKERS} workers of prefetch {PREFETCH}: every key completed in {took:.1f}s"
    )
    # Copies still queued (or handed back at the stop) are duplicates of completed
    # keys: a worker with the store at hand settles them, and must run none.
    drain = await start_consumer(consumer_settings())
    await settle_all(broker, settings, dead_letters=0)
    await finished(drain, broker, settings, dead_letters=0)

    starts, ends = runs(ledger)
    twice = {key: n for key, n in ends.items() if n > 1}
    assert not twice, f"{len(twice)} keys ran to their effect twice: {_some(twice)}"
    # Stricter: no lease lapsed at all. A run cut short because its lease could
    # not be renewed in time (cancelled before its effect, so safe) and run
    # again would show as a second start.
    again = {key: n for key, n in starts.items() if n > 1}
    assert not again, f"{len(again)} runs cut short and run again: {_some(again)}"
    assert set(ends) == set(keys), f"lost: {sorted(set(keys) - set(ends))[:10]}"


def _twice(runs: Counter[str]) -> int:
    return sum(1 for n in runs.values() if n > 1)


def _some(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} x{n}" for key, n in sorted(counts.items())[:10])
