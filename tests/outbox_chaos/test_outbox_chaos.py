"""The outbox chaos run, reduced: a few hundred orders, kills, a broker and a PostgreSQL restart.

On private servers (a RabbitMQ node, a PostgreSQL cluster, a Redis of the
run's own), two web processes of the FastAPI example (one with a relay
inside) and a ``semel relay`` take 300 orders, a tenth rolled back on
purpose; a web process and the relay are SIGKILLed, the broker and
PostgreSQL restarted mid-flow. ``python -m tests.outbox_chaos`` is the full
run. Many processes on two cores: it belongs to the suite's serial phase.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from tests.chaos.rabbit import RESTART_WARNINGS
from tests.chaos.verdict import UNEXPLAINED
from tests.outbox_chaos.run import OutboxChaosConfig, Report, run_outbox_chaos
from tests.outbox_chaos.table import evidence, render

pytestmark = [
    pytest.mark.slow,
    *RESTART_WARNINGS,
]


def show(report: Report) -> str:
    console = Console(width=120, record=True)
    console.print(render([report]))
    for line in evidence(report):
        console.print(line, markup=False)
    return console.export_text()


@pytest.mark.timeout(150)
async def test_every_committed_order_is_published_once_per_id_and_no_rolled_back_one(
    tmp_path: Path,
) -> None:
    config = OutboxChaosConfig(
        orders=300,
        rate=30,
        fail=0.1,
        repeat=0.15,
        web=2,
        relays=1,
        relays_in_web=1,
        kill_every=2.5,
        consumer_kills=1,
        seed=3,
        drain_deadline=45,
        keep=tmp_path,
    )
    report = await run_outbox_chaos(config)
    table = show(report)
    print(table)

    verdict = report.verdict
    assert report.drained, f"unsent rows or unconsumed orders after the drain\n{table}"
    assert report.driven.unanswered == [], table
    assert verdict.lost == [], table
    assert verdict.wrong_id == [], table
    assert verdict.rolled_back_published == [], table
    assert verdict.staged_without_order == [], table
    assert verdict.answered_not_committed == [], table
    assert verdict.unsent == 0, table
    assert verdict.not_consumed == [], table
    assert verdict.count(UNEXPLAINED) == 0, table
    # The run did what it says: orders of both kinds, and every fault.
    assert verdict.committed >= 250, table
    assert verdict.rolled_back > 0, table
    assert report.web_kills >= 1, table
    assert report.relay_kills >= 1, table
    assert report.broker_restarts == 1, table
    assert report.pg_restarts == 1, table
