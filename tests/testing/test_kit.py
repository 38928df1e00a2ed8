"""The testing kit says what the worker would do, on the embedded SQLite store."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pydantic
import pytest

from semel.consumer import Context, PermanentError
from semel.consumer.names import Reason
from semel.consumer.testing import HandlerKit, SyncHandlerKit, context

pytestmark = pytest.mark.timeout(20)


async def recorded(ctx: Context) -> dict[str, Any]:
    return {"seen": ctx.body["n"], "attempt": ctx.attempt}


async def test_a_completed_message_is_acked_with_its_result_stored() -> None:
    async with HandlerKit(recorded) as kit:
        verdict = await kit.send({"n": 1}, key="k-1")
    assert verdict.acked
    assert verdict.frame == "ack"
    assert verdict.key == "k-1"
    assert verdict.attempt == 1
    assert verdict.stored == {"seen": 1, "attempt": 1}
    assert verdict.copy is None


async def test_a_duplicate_key_is_answered_without_running_the_handler() -> None:
    runs: list[str] = []

    async def counted(ctx: Context) -> str:
        runs.append(ctx.key)
        return "done"

    async with HandlerKit(counted) as kit:
        first, second = await kit.send_many([{"n": 1}, {"n": 1}], key="k-1")
    assert first.acked
    assert second.duplicate
    assert second.outcome == "duplicate"
    assert runs == ["k-1"]
    assert second.stored == "done"


async def test_a_failing_handler_is_retried_tier_by_tier_then_dead_lettered() -> None:
    async def failing(ctx: Context) -> None:
        raise RuntimeError(f"down on attempt {ctx.attempt}")

    async with HandlerKit(failing, retry_delays=[1, 5], max_attempts=3) as kit:
        first = await kit.send({"n": 1}, key="k-1")
        assert first.retried
        assert (first.tier, first.delay) == (1, 1.0)
        assert first.headers["x-semel-attempts"] == 2
        assert first.copy is not None
        assert first.copy.routing_key == "1s"
        second = await kit.redeliver(first)
        assert second.attempt == 2
        assert second.retried
        assert (second.tier, second.delay) == (2, 5.0)
        third = await kit.redeliver(second)
    assert third.attempt == 3
    assert third.dead_lettered
    assert third.reason is Reason.MAX_ATTEMPTS
    assert third.headers["x-semel-reason"] == "max-attempts"
    assert third.headers["x-semel-error"] == "RuntimeError: down on attempt 3"
    assert third.headers["x-semel-key"] == "k-1"
    assert third.record is not None
    assert third.record.status == "failed"


async def test_a_permanent_error_is_dead_lettered_at_once() -> None:
    async def refusing(ctx: Context) -> None:
        raise PermanentError("never")

    async with HandlerKit(refusing) as kit:
        verdict = await kit.send({"n": 1}, key="k-1")
    assert verdict.dead_lettered
    assert verdict.reason is Reason.PERMANENT_ERROR
    assert verdict.headers["x-semel-reason"] == "permanent-error"
    assert verdict.error == "PermanentError: never"


class Order(pydantic.BaseModel):
    order_id: str
    amount: int


async def test_an_invalid_typed_body_is_dead_lettered_with_its_validation_errors() -> None:
    runs: list[Order] = []

    async def typed(order: Order) -> int:
        runs.append(order)
        return order.amount

    async with HandlerKit(typed, key_source="body:order_id") as kit:
        good = await kit.send({"order_id": "o-1", "amount": 3})
        bad = await kit.send({"order_id": "o-2", "amount": "three"})
    assert good.acked
    assert good.stored == 3
    assert bad.dead_lettered
    assert bad.reason is Reason.INVALID_BODY
    assert bad.key == "o-2"
    assert '"amount"' in bad.headers["x-semel-validation-errors"]
    assert bad.record is None  # never claimed
    assert len(runs) == 1


async def test_a_message_without_a_key_is_dead_lettered_as_missing_key() -> None:
    async with HandlerKit(recorded) as kit:
        verdict = await kit.send({"n": 1})
    assert verdict.dead_lettered
    assert verdict.reason is Reason.MISSING_KEY
    assert verdict.key is None
    assert verdict.headers["x-semel-key"] == ""


def test_a_plain_def_handler_runs_from_a_sync_test() -> None:
    threads: list[str] = []

    def plain(ctx: Context) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return {"seen": ctx.body["n"]}

    with SyncHandlerKit(plain, key_source="message_id") as kit:
        verdict = kit.send({"n": 2}, key="m-1")
    assert verdict.acked
    assert verdict.stored == {"seen": 2}
    assert threads == ["semel-handler"]  # on a thread of its own, as the worker runs it


async def test_a_key_held_by_another_delivery_is_parked_then_a_duplicate() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(ctx: Context) -> str:
        started.set()
        await release.wait()
        return "done"

    async with HandlerKit(slow) as kit:
        first = asyncio.create_task(kit.send({"n": 1}, key="k-1"))
        await started.wait()
        parked = await kit.send({"n": 1}, key="k-1")
        release.set()
        assert (await first).acked
        again = await kit.redeliver(parked)
    assert parked.parked
    assert parked.outcome == "in-progress"
    assert parked.frame == "ack"
    assert parked.copy is not None
    assert parked.copy.exchange == "semel.work.retry"
    assert again.duplicate
    assert again.stored == "done"


def test_a_context_for_a_plain_unit_test() -> None:
    ctx = context({"n": 4}, key="k-9", attempt=2)
    assert (ctx.key, ctx.body, ctx.attempt, ctx.fence, ctx.headers) == ("k-9", {"n": 4}, 2, 1, {})
    assert recorded.__name__
    assert ctx.message_id is None


async def test_two_hundred_messages_each_get_their_verdict() -> None:
    # How long they take is measured by `python -m bench.kit`, not asserted here.
    async with HandlerKit(recorded) as kit:
        verdicts = [await kit.send({"n": n}, key=f"k-{n}") for n in range(200)]
    assert all(verdict.acked and verdict.stored for verdict in verdicts)
    assert len({verdict.key for verdict in verdicts}) == 200
