"""The delivery's fields bound to a handler's log lines, and the summary of settled
deliveries, without a broker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog

from semel.consumer.delivery import log_lines
from semel.consumer.delivery.handler import Context, start_in_thread
from semel.consumer.delivery.log_lines import SUMMARY_EVENT, Summary, bound_to

pytestmark = pytest.mark.timeout(10)

FIELDS = {"key", "fence", "attempt", "message_id", "routing_key"}


def context(key: str) -> Context:
    return Context(
        key=key,
        body={},
        headers={},
        routing_key="order.paid",
        message_id=f"m-{key}",
        attempt=2,
        fence=7,
    )


def bound() -> dict[str, Any]:
    return structlog.contextvars.get_contextvars()


async def test_the_fields_are_bound_while_the_handler_runs_and_restored_after() -> None:
    structlog.contextvars.bind_contextvars(request="outer")
    try:
        with bound_to(context("k-1")):
            assert bound() == {
                "request": "outer",
                "key": "k-1",
                "fence": 7,
                "attempt": 2,
                "message_id": "m-k-1",
                "routing_key": "order.paid",
            }
        assert bound() == {"request": "outer"}
    finally:
        structlog.contextvars.clear_contextvars()


async def test_a_plain_handlers_thread_sees_its_own_delivery_only() -> None:
    seen: list[dict[str, Any]] = []

    def handler(given: Context) -> None:
        seen.append(bound())

    for key in ("k-1", "k-2"):
        with bound_to(context(key)):
            running = start_in_thread(handler, context(key), lambda: None)
        await running
    assert [line["key"] for line in seen] == ["k-1", "k-2"]
    assert all(line.keys() >= FIELDS for line in seen)
    assert not FIELDS & bound().keys()


class Lines:
    """Stands in for the summary's logger: what it was asked to write, and in what context."""

    def __init__(self) -> None:
        self.written: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
        self.arrived = asyncio.Event()

    def info(self, event: str, **fields: Any) -> None:
        self.written.append((event, fields, bound()))
        self.arrived.set()

    async def next(self) -> tuple[str, dict[str, Any], dict[str, Any]]:
        await asyncio.wait_for(self.arrived.wait(), 5)
        self.arrived.clear()
        return self.written[-1]


async def test_the_summary_counts_each_period_in_one_line_and_is_silent_when_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = Lines()
    monkeypatch.setattr(log_lines, "log", lines)
    summary = Summary(every=0.05)
    with bound_to(context("k-1")):  # a delivery's task starts the period
        for outcome in ("completed", "completed", "retry"):
            summary.add(outcome)
    assert lines.written == []  # counted, not yet written
    event, fields, context_then = await lines.next()
    assert event == SUMMARY_EVENT
    assert (fields["completed"], fields["retry"], fields["total"]) == (2, 1, 3)
    assert context_then == {}  # the line belongs to no delivery
    summary.flush()  # nothing settled since: no line
    summary.add("duplicate")
    _, fields, _ = await lines.next()
    assert {name: n for name, n in fields.items() if name != "seconds"} == {
        "duplicate": 1,
        "total": 1,
    }
    assert len(lines.written) == 2


async def test_a_stop_writes_the_last_periods_counts_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = Lines()
    monkeypatch.setattr(log_lines, "log", lines)
    summary = Summary(every=3600)
    summary.add("dead-letter")
    summary.flush()
    assert [fields["dead-letter"] for _, fields, _ in lines.written] == [1]
