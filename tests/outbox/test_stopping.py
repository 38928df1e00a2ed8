"""A relay's stop is bounded whatever hangs under it: a pass whose clean-up on
cancellation takes long (psycopg waiting on a server that does not answer its
cancel request), a channel whose close outlives its cancellation, a helper that
ignores it. Each step left behind is named in one warning; no server is needed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, MutableMapping, Sequence
from typing import Any

import pytest
import structlog

from semel.consumer import stopping
from semel.consumer.outbox import relay as relay_module
from semel.consumer.outbox import runner
from semel.consumer.outbox.relay import Relay
from semel.consumer.outbox.runner import RelayOptions, running_relay
from semel.stores.postgres.outbox import Ordering
from semel.stores.postgres.outbox import Publish as PublishRows

pytestmark = pytest.mark.timeout(30)

STEP = 0.2  # seconds each bounded step gets here
STUCK = 60.0  # longer than the test may run


class Hangs:
    """What lets every hung call end once a test is over."""

    release = asyncio.Event()


hangs = Hangs()


@pytest.fixture(autouse=True)
async def short_steps(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    monkeypatch.setattr(relay_module, "STOP_WAIT", STEP)
    monkeypatch.setattr(stopping, "UNWIND", STEP)
    monkeypatch.setattr(runner, "UNWIND", STEP)
    monkeypatch.setattr(runner, "BROKER_CALL_TIMEOUT", STEP)
    hangs.release = asyncio.Event()  # of this test's loop
    yield
    hangs.release.set()
    await asyncio.sleep(0.05)  # what was left behind ends


async def outlive_cancellation() -> None:
    """Hang, cancelled or not, as a clean-up waiting on a peer that never answers."""
    while not hangs.release.is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await hangs.release.wait()


class Source:
    """An outbox whose passes hang when ``stuck``, otherwise find nothing."""

    def __init__(self, *, stuck: bool = False) -> None:
        self.commits = asyncio.Event()
        self.stuck = stuck
        self.passes = 0

    async def relay(
        self, limit: int, publish: PublishRows, ordering: Ordering = Ordering.OLDEST_FIRST
    ) -> int:
        self.passes += 1
        if self.stuck:
            await outlive_cancellation()
        return 0

    async def purge_outbox(self, limit: int = 10_000) -> int:
        return 0

    async def unsent(self) -> int:
        return 0

    async def check_schema(self) -> None:
        pass


class Channel:
    """A channel whose close outlives its cancellation when ``stuck``."""

    def __init__(self, *, stuck: bool) -> None:
        self.stuck = stuck
        self.default_exchange: Any = None

    async def close(self) -> None:
        if self.stuck:
            await outlive_cancellation()

    async def get_exchange(self, name: str, ensure: bool = False) -> Any:
        raise AssertionError("nothing is published here")


class Connection:
    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    async def channel(self, **options: Any) -> Channel:
        return self._channel


async def ends_within(seconds: float, awaitable: Any) -> float:
    """How long ``awaitable`` took; fails the test if it takes more than ``seconds``."""
    started = time.monotonic()
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        pytest.fail(f"still running after {seconds}s")
    task.result()
    return time.monotonic() - started


def cut_short(logs: Sequence[MutableMapping[str, Any]]) -> list[str]:
    return [entry["step"] for entry in logs if entry["event"] == "stop step cut short"]


async def test_a_pass_that_outlives_its_cancellation_is_left_behind() -> None:
    source = Source(stuck=True)
    relay = Relay(source, Channel(stuck=False))  # type: ignore[arg-type]
    task = asyncio.create_task(relay.run())
    await asyncio.sleep(0.05)
    assert source.passes == 1
    with structlog.testing.capture_logs() as logs:
        took = await ends_within(5 * STEP, relay.stop(task))
    assert took >= STEP  # the pass was given its time first
    assert cut_short(logs) == ["the outbox relay's pass"]
    assert [entry["unwound"] for entry in logs if "unwound" in entry] == [False]


async def test_a_pass_that_ends_in_time_is_followed_by_the_last_passes() -> None:
    source = Source()
    relay = Relay(source, Channel(stuck=False), poll=STUCK)  # type: ignore[arg-type]
    task = asyncio.create_task(relay.run())
    await asyncio.sleep(0.05)
    with structlog.testing.capture_logs() as logs:
        await ends_within(5 * STEP, relay.stop(task))
    assert task.done()
    assert source.passes == 2  # its pass, then one last
    assert cut_short(logs) == []


async def test_a_channel_whose_close_hangs_does_not_hold_the_relay_up() -> None:
    channel = Channel(stuck=True)
    options = RelayOptions(table="outbox", purge_interval=None)

    async def run() -> None:
        async with running_relay(Source(), Connection(channel), options):  # type: ignore[arg-type]
            await asyncio.sleep(0.05)

    with structlog.testing.capture_logs() as logs:
        await ends_within(10 * STEP, run())
    assert cut_short(logs) == ["closing the relay's channel"]


async def test_a_watch_that_ignores_cancellation_does_not_hold_the_relay_up() -> None:
    options = RelayOptions(table="outbox", purge_interval=None, watch_interval=STUCK)

    async def watch(source: object) -> None:
        await outlive_cancellation()

    async def run() -> None:
        connection = Connection(Channel(stuck=False))
        async with running_relay(Source(), connection, options, watch):  # type: ignore[arg-type]
            await asyncio.sleep(0.05)

    with structlog.testing.capture_logs() as logs:
        await ends_within(10 * STEP, run())
    assert cut_short(logs) == ["the outbox listener, purge and watch"]


async def test_within_raises_what_the_step_raised_in_time() -> None:
    async def failing() -> None:
        raise LookupError("no")

    with pytest.raises(LookupError):
        await stopping.within(STEP, "a failing step", failing())
    assert await stopping.within(STEP, "a quick step", asyncio.sleep(0)) is True
    assert stopping.current() != "a quick step"  # no longer under way


async def test_exit_after_ends_the_process_naming_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    with structlog.testing.capture_logs() as logs:
        stopping.exit_after(0.05, code=0)
        step = stopping.within(STUCK, "a step that hangs", outlive_cancellation())
        task = asyncio.ensure_future(step)
        for _ in range(100):
            if exits:
                break
            await asyncio.sleep(0.02)
        hangs.release.set()
        await task
    assert exits == [0]
    [warning] = [entry for entry in logs if entry["event"] == "stop not finished in time, exiting"]
    assert warning["step"] == "a step that hangs"
