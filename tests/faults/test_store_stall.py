"""A store connection that goes silent never lets two workers run one key at once.

Worker A reaches the store through a proxy, worker B directly; both consume
one queue. A runs a long handler for one key when its link to the store is
stalled: packets dropped, no reset, no error, until a deadline fires. Then:

1. A's handler is cancelled no later than its lease could have run out, and
   B's run of the key (once the lease lapsed) starts only after A's ended;
2. A's other deliveries are not stuck: messages published during the stall
   are all processed (by B, or by A once its calls time out and hand them
   back) within three leases, nothing dead-lettered, nothing lost;
3. once the link flows again, A recovers by itself and processes new messages.

A correct worker may hand messages back, pause consumption while the store
does not answer, or send a key to the conflict queue and retry it; none of
that is asserted against. Each requirement is checked and reported on its
own, so one failure does not hide the others.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from semel.consumer import Context
from semel.consumer.names import Topology
from semel.stores.base import Status, Store
from tests.consumer.conftest import ConsumerSettings, StartConsumer
from tests.consumer.harness import Broker, TcpProxy
from tests.consumer.test_delivery import only_dead_letters
from tests.consumer.test_faults import through_proxy
from tests.servers import free_port

pytestmark = pytest.mark.timeout(150)

LEASE = 3.0  # SEMEL_LOCK_TTL: a heartbeat every second
MARGIN = 0.5  # seconds a cancellation may take to land after the lease ran out
HELD = "held"  # the key A is running when its store link stalls
HELD_FOR = 40.0  # A's run of HELD, unless cancelled; longer than the whole scenario
SHORT = 0.05  # every other run
DURING = 20  # messages published while A's link is stalled
AFTER = 5  # messages published after it flows again, for A alone
HANDLER = "tests.faults.test_store_stall:"


@dataclass
class Run:
    """One handler run, timed on this process's monotonic clock."""

    key: str
    worker: str
    start: float
    end: float | None = None
    cancelled: bool = False


RUNS: list[Run] = []  # both workers run in this process: the ledger is outside the store


async def _run(worker: str, context: Context) -> Any:
    run = Run(context.key, worker, time.monotonic())
    RUNS.append(run)
    try:
        await asyncio.sleep(HELD_FOR if worker == "A" and context.key == HELD else SHORT)
    except asyncio.CancelledError:
        run.cancelled = True
        raise
    finally:
        run.end = time.monotonic()
    return {"worker": worker}


async def worker_a(context: Context) -> Any:
    return await _run("A", context)


async def worker_b(context: Context) -> Any:
    return await _run("B", context)


def runs_of(key: str, worker: str | None = None) -> list[Run]:
    return [r for r in RUNS if r.key == key and worker in (None, r.worker)]


def completed(keys: list[str], worker: str | None = None) -> bool:
    return all(
        any(r.end is not None and not r.cancelled for r in runs_of(key, worker)) for key in keys
    )


class Checks:
    """Requirements checked one after the other; the test fails at the end with every miss."""

    def __init__(self) -> None:
        self.misses: list[str] = []

    def expect(self, holds: bool, what: str) -> bool:
        if not holds:
            self.misses.append(what)
        return holds

    async def within(
        self, deadline: float, check: Callable[[], Awaitable[bool]], what: str
    ) -> bool:
        end = time.monotonic() + deadline
        while not await check():
            if time.monotonic() > end:
                return self.expect(False, f"{what}: not within {deadline:.1f}s")
            await asyncio.sleep(0.05)
        return True

    def verify(self) -> None:
        if self.misses:
            pytest.fail("\n".join(["requirements missed:", *self.misses]), pytrace=False)


async def status_completed(store: Store, keys: list[str]) -> bool:
    for key in keys:
        record = await store.get(key)
        if record is None or record.status is not Status.COMPLETED:
            return False
    return True


@pytest.mark.parametrize("backend", ["postgres", "redis", "dynamodb-moto"])
async def test_a_stalled_store_link_never_lets_two_workers_run_one_key(
    consumer_settings: ConsumerSettings,
    broker: Broker,
    store: Store,
    start_consumer: StartConsumer,
) -> None:
    RUNS.clear()
    base = consumer_settings()
    port = free_port()
    target, through = through_proxy(base, port)
    proxy = await TcpProxy(target, port).start()
    common: dict[str, Any] = {"lock_ttl": LEASE, "handler_timeout": 60.0}
    a_settings = consumer_settings(**common, **through, handler=HANDLER + "worker_a")
    b_settings = consumer_settings(**common, handler=HANDLER + "worker_b")
    checks = Checks()
    try:
        a = await start_consumer(a_settings)
        await broker.publish(a_settings, {"n": 0}, key=HELD)
        await checks.within(15, lambda: _true(bool(runs_of(HELD, "A"))), "A running 'held'")
        b = await start_consumer(b_settings)
        await checks.within(
            15, lambda: _consumers(broker, a_settings.queue, 2), "B attached next to A"
        )
        # A's lease was last renewed before this instant: it runs out by LEASE after it.
        stalled_at = time.monotonic()
        proxy.stall()
        during = [f"during-{i}" for i in range(DURING)]
        for key in during:
            await broker.publish(a_settings, {"n": 1}, key=key)
        published_at = time.monotonic()

        # 1. A's run ends (cancelled) by the time its lease could have run out ...
        (a_run,) = runs_of(HELD, "A")
        if await checks.within(
            LEASE + 10, lambda: _true(a_run.end is not None), "1. A's run of 'held' ended"
        ):
            assert a_run.end is not None
            late = a_run.end - (stalled_at + LEASE)
            checks.expect(
                late <= MARGIN,
                f"1. A's run of 'held' ended {late:.2f}s after its lease ran out at the latest "
                f"(allowed {MARGIN:g}s)",
            )
            checks.expect(a_run.cancelled, "1. A's run of 'held' was not cancelled")

        # 2. ... and the messages of the stall are all processed, A's included.
        if not await checks.within(
            max(0.0, published_at + 3 * LEASE - time.monotonic()),
            lambda: _true(completed(during)),
            "2. every message published during the stall processed",
        ):
            checks.expect(
                False,
                f"2.   processed within {3 * LEASE:g}s of publishing: "
                f"{sum(completed([k]) for k in during)}/{DURING} "
                f"(by A {sum(completed([k], 'A') for k in during)}, "
                f"by B {sum(completed([k], 'B') for k in during)})",
            )
        dlq = Topology(a_settings.queue).dead_letter_queue
        checks.expect(await broker.depth(dlq) == 0, "2. a message dead-lettered during the stall")

        # 1. (cont.) B runs 'held' once A's lease lapsed, never while A's run went on.
        if await checks.within(
            20, lambda: _true(completed([HELD], "B")), "1. B ran 'held' while A's link stalled"
        ):
            assert a_run.end is not None
            (b_run,) = [r for r in runs_of(HELD, "B") if not r.cancelled]
            checks.expect(
                b_run.start >= a_run.end,
                f"1. B's run of 'held' started {a_run.end - b_run.start:.2f}s before A's ended",
            )

        # 3. The link flows again: A alone consumes, and recovers by itself.
        proxy.resume()
        await checks.within(
            30,
            lambda: status_completed(store, [HELD, *during]),
            "every key of the stall completed after it",
        )
        assert await b.finish() == 0
        after = [f"after-{i}" for i in range(AFTER)]
        for key in after:
            await broker.publish(a_settings, {"n": 2}, key=key)
        await checks.within(
            30, lambda: _true(completed(after, "A")), "3. A processed new messages after resume"
        )
        await checks.within(
            30,
            lambda: only_dead_letters(broker, a_settings, 0),
            "every queue empty, nothing dead-lettered",
        )
        assert await a.finish() == 0
    finally:
        await proxy.cut()

    for key in [HELD, *during, *after]:
        done = [r for r in runs_of(key) if r.end is not None and not r.cancelled]
        checks.expect(len(done) <= 1, f"{key!r} ran to completion {len(done)} times")
    checks.verify()


async def _true(value: bool) -> bool:
    return value


async def _consumers(broker: Broker, queue: str, count: int) -> bool:
    return await broker.consumers(queue) >= count
