"""An async handler's time limit (run_leased on a shared timer): the same outcomes
as ``asyncio.timeout`` gave, told apart from every other cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from semel.consumer.delivery.handler import Context
from semel.consumer.delivery.lease import run_leased
from semel.consumer.errors import HandlerTimeout

pytestmark = pytest.mark.timeout(30)


class _Renewal:
    """What run_leased asks of a renewal, with nothing renewed: pure logic."""

    lost: Exception | None = None

    def guard(self, owner: asyncio.Task[Any], give_up: float) -> None:
        self.owner = owner

    def unguard(self) -> None:
        pass


CONTEXT = Context(
    key="k", body={}, headers={}, routing_key="r", message_id=None, attempt=1, fence=1
)


def _cancelling() -> int:
    task = asyncio.current_task()
    assert task is not None
    return task.cancelling()


async def _run(handler: Any, limit: float) -> Any:
    return await run_leased(handler, CONTEXT, _Renewal(), limit)  # type: ignore[arg-type]


async def test_a_handler_past_its_limit_is_a_timeout_and_leaves_no_cancellation() -> None:
    async def slow(_: Context) -> None:
        await asyncio.sleep(10)

    with pytest.raises(HandlerTimeout, match=r"longer than 0\.1s"):
        await _run(slow, 0.1)
    assert _cancelling() == 0
    await asyncio.sleep(0)  # no cancellation left pending for the caller


async def test_a_handler_that_swallows_the_limit_returns_its_result() -> None:
    async def stubborn(_: Context) -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "kept"
        return "slept"

    assert await _run(stubborn, 0.1) == "kept"
    assert _cancelling() == 0
    await asyncio.sleep(0)


async def test_a_handler_within_its_limit_is_never_cancelled() -> None:
    async def quick(_: Context) -> str:
        await asyncio.sleep(0.01)
        return "done"

    # A limit fifty times the handler's time: a loaded machine's pause of the loop
    # must not pass for a handler running long.
    for _ in range(20):
        assert await _run(quick, 0.5) == "done"
    await asyncio.sleep(0.6)  # past every limit set above: none fires late
    assert _cancelling() == 0


async def test_a_timeout_the_handler_raises_itself_is_its_own_failure() -> None:
    async def own(_: Context) -> None:
        raise TimeoutError("downstream")

    with pytest.raises(TimeoutError, match="downstream"):
        await _run(own, 5)


async def test_a_cancellation_from_outside_is_not_a_timeout() -> None:
    started = asyncio.Event()

    async def waits(_: Context) -> None:
        started.set()
        await asyncio.sleep(10)

    runner = asyncio.create_task(_run(waits, 5))
    await started.wait()
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
