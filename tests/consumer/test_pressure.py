"""The admission limit that follows the store's answer times (pure logic, no store)."""

from __future__ import annotations

import asyncio

import pytest

from consumer.delivery.pressure import Pressure

pytestmark = pytest.mark.timeout(10)


def test_a_slow_answer_halves_the_limit_once_per_target_period() -> None:
    seen: list[int] = []
    pressure = Pressure(ceiling=64, target=60.0, on_limit=seen.append)
    for _ in range(10):  # one slow batch answers many deliveries at once
        pressure.answered(61.0)
    assert pressure.limit == 32
    assert seen == [64, 32]


def test_quick_answers_raise_the_limit_back_to_the_ceiling() -> None:
    pressure = Pressure(ceiling=4, target=0.0001)
    pressure.answered(1.0)  # cut from 4 to 2 (first cut is always allowed)
    assert pressure.limit == 2
    pressure.target = 10.0
    for _ in range(5):
        pressure.answered(0.001)
    assert pressure.limit == 4  # never past the ceiling


def test_answers_near_the_target_leave_the_limit_alone() -> None:
    pressure = Pressure(ceiling=8, target=1.0)
    pressure.answered(0.1)
    pressure.limit = 5
    pressure.answered(0.8)  # neither slow nor quick
    assert pressure.limit == 5


async def test_deliveries_over_the_limit_wait_their_turn_in_order() -> None:
    pressure = Pressure(ceiling=2, target=1.0)
    await pressure.admit()
    await pressure.admit()
    order: list[int] = []

    async def later(n: int) -> None:
        await pressure.admit()
        order.append(n)

    waiting = [asyncio.create_task(later(n)) for n in range(3)]
    await asyncio.sleep(0)
    assert order == []
    assert pressure.admitted == 2
    pressure.leave()
    await asyncio.sleep(0)
    assert order == [0]
    pressure.leave()
    pressure.leave()
    await asyncio.gather(*waiting)
    assert order == [0, 1, 2]
    assert pressure.admitted == 2  # the first two left, the three came in


async def test_a_waiter_cancelled_leaves_no_place_taken() -> None:
    pressure = Pressure(ceiling=1, target=1.0)
    await pressure.admit()
    gone = asyncio.create_task(pressure.admit())
    await asyncio.sleep(0)
    gone.cancel()
    pressure.leave()  # wakes `gone` and cancels it in the same turn
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert pressure.admitted == 0
    await asyncio.wait_for(pressure.admit(), 1)  # the place was passed on
    assert pressure.admitted == 1


async def test_a_lowered_limit_holds_back_new_deliveries_until_enough_left() -> None:
    pressure = Pressure(ceiling=4, target=0.5)
    for _ in range(4):
        await pressure.admit()
    pressure.answered(1.0)  # limit 2, four still admitted
    blocked = asyncio.create_task(pressure.admit())
    await asyncio.sleep(0)
    pressure.leave()
    pressure.leave()
    await asyncio.sleep(0)
    assert not blocked.done()  # 2 admitted = the limit
    pressure.leave()
    await asyncio.wait_for(blocked, 1)
