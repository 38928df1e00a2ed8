"""``semel publish``'s report when the broker goes away mid-run, without a broker.

A stand-in exchange confirms the first publishes, then every publish raises
as aiormq does on a lost connection. Every message must end with one outcome:
confirmed, failed (published, no answer: its key listed) or not sent.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aio_pika.abc import AbstractExchange
from aiormq.exceptions import AMQPConnectionError
from pamqp.commands import Basic

from semel.consumer.commands.traffic import PublishPlan, build_messages, publish_all
from semel.consumer.delivery.message import KeySource

pytestmark = pytest.mark.timeout(10)

HEADER = KeySource.parse("header:Idempotency-Key")


class DyingExchange:
    """Confirms ``alive`` publishes, each after a moment; the connection is then gone."""

    def __init__(self, alive: int) -> None:
        self.alive = alive
        self.calls = 0

    async def publish(self, message: Any, routing_key: str, **_: Any) -> Basic.Ack:
        self.calls += 1
        if self.calls > self.alive:
            raise AMQPConnectionError("Server connection reset")
        await asyncio.sleep(0.001)
        return Basic.Ack()


async def test_a_connection_lost_mid_run_leaves_every_message_with_one_outcome() -> None:
    messages = build_messages(PublishPlan(count=500, key_prefix="p"), HEADER, 4096)
    exchange = DyingExchange(alive=120)
    report = await publish_all(cast(AbstractExchange, exchange), messages, "order.paid", window=16)

    assert report.confirmed == 120
    assert report.failed >= 1
    assert report.published == report.confirmed + report.failed
    assert report.not_sent == 500 - report.published
    assert len(report.failed_keys) == report.failed
    # Sent in order: the failed are the ones after the confirmed.
    assert set(report.failed_keys) == {f"p-{n}" for n in range(121, report.published + 1)}
    assert report.error == "AMQPConnectionError: Server connection reset"
    assert not report.ok
    tail = f"failed {report.failed} (no answer), not sent {report.not_sent}"
    assert report.summary().endswith(tail)


async def test_a_run_the_broker_confirms_whole_has_nothing_failed() -> None:
    messages = build_messages(PublishPlan(count=50, key_prefix="p"), HEADER, 4096)
    exchange = DyingExchange(alive=50)
    report = await publish_all(cast(AbstractExchange, exchange), messages, "order.paid")
    assert (report.confirmed, report.failed, report.not_sent, report.error) == (50, 0, 0, None)
    assert report.ok
    assert report.summary() == "published 50, confirmed 50, returned 0, nacked 0"
