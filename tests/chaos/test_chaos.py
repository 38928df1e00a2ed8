"""The chaos run, reduced: every store, a few hundred messages, every fault once or twice.

Each run gets two workers, two SIGKILLs mid-handler, one broker restart and
one store outage longer than the lease (SQLite has no server to stop), on a
private RabbitMQ node shared by the runs. The PostgreSQL store also runs in
transactional mode, where no duplicate effect is allowed at all. One more
run blackholes one worker's link to the store for more than two leases, and
one restarts workers with plain ``def`` handlers as a rolling upgrade does.
Against a Redis Cluster and a primary under Sentinel, with every write
acknowledged by a replica, the store fault is a primary SIGKILLed mid-flow
instead (no broker restart there). The Redis run is made once more with
FastStream apps carrying semel's middleware as the workers.
``python -m tests.chaos`` is the full run, with every fault kind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from tests.chaos.faults import BLACKHOLE, REPLICATED_REDIS, ROLLING
from tests.chaos.rabbit import RESTART_WARNINGS, RabbitNode
from tests.chaos.run import ChaosConfig, Report, run_chaos
from tests.chaos.table import evidence, tables
from tests.chaos.transactional import TRANSACTIONAL
from tests.chaos.verdict import UNEXPLAINED, UNREPLICATED
from tests.chaos.workers import FASTSTREAM
from tests.conftest import rabbitmq_lane

pytestmark = [
    pytest.mark.slow,
    *RESTART_WARNINGS,
]

STORES = ["sqlite", "postgres", "redis", "dynamodb", TRANSACTIONAL]
BLACKHOLE_STORE = "postgres"
ROLLING_STORE = "postgres"
FASTSTREAM_STORE = "redis"


@pytest.fixture(scope="module")
def private_broker(pytestconfig: pytest.Config) -> Iterator[RabbitNode]:
    node = asyncio.run(RabbitNode.start(lane=rabbitmq_lane(pytestconfig)))
    try:
        yield node
    finally:
        node.stop()


def show(report: Report) -> str:
    console = Console(width=120, record=True)
    for table in tables([report]):
        console.print(table)
    for line in evidence(report):
        console.print(line, markup=False)
    return console.export_text()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("store", STORES)
async def test_effectively_once_under_faults(
    store: str, private_broker: RabbitNode, tmp_path: Path
) -> None:
    config = ChaosConfig(
        store=store,
        messages=300,
        workers=2,
        kills=2,
        seed=7,
        rate=40,
        broker_down=2.0,
        outage=4.0,
        outage_when_running=3,
        drain_deadline=60,
        keep=tmp_path,
    )
    report = await run_chaos(config, private_broker)
    table = show(report)
    print(table)  # shown by pytest when the test fails

    assert report.drained, f"keys still unsettled after the drain deadline\n{table}"
    assert report.verdict.lost == [], table
    assert report.verdict.count(UNEXPLAINED) == 0, table
    if store == TRANSACTIONAL:
        # The effect commits with the completion: no fault can repeat it.
        assert report.verdict.duplicates == [], table
    # The faults did happen, while messages flowed.
    assert report.kills == config.kills, table
    assert report.restarts >= config.kills, table
    assert report.broker_restarts == 1, table
    assert report.outages == (0 if store == "sqlite" else 1), table
    sent = report.sent
    assert (sent.total - sent.originals) / sent.total >= 0.3, table
    assert sent.concurrent_copies > 0, table
    assert sent.late_copies > 0, table


@pytest.mark.timeout(120)
async def test_faststream_apps_with_the_middleware_lose_and_repeat_nothing_under_faults(
    private_broker: RabbitNode, tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    if rabbitmq_lane(pytestconfig) != "3":
        # The middleware settles through the worker's pipeline, whose runs in
        # this file prove each broker version: one lane is enough for it.
        pytest.skip("the FastStream front door's chaos run: one lane")
    # The workers are FastStream apps whose subscriber is the ledger handler,
    # semel's middleware on their broker: the same kills, broker restart and
    # store outage as the worker's reduced run, judged the same way.
    config = ChaosConfig(
        store=FASTSTREAM_STORE,
        front=FASTSTREAM,
        messages=300,
        workers=2,
        kills=2,
        seed=7,
        rate=40,
        duplicates=0.35,
        broker_down=2.0,
        outage=4.0,
        outage_when_running=3,
        drain_deadline=60,
        keep=tmp_path,
    )
    report = await run_chaos(config, private_broker)
    table = show(report)
    print(table)

    assert report.drained, f"keys still unsettled after the drain deadline\n{table}"
    assert report.verdict.lost == [], table
    assert report.verdict.count(UNEXPLAINED) == 0, table
    assert report.kills == config.kills, table
    assert report.broker_restarts == 1, table
    assert report.outages == 1, table
    sent = report.sent
    assert (sent.total - sent.originals) / sent.total >= 0.3, table


@pytest.mark.timeout(120)
async def test_a_worker_with_a_blackholed_store_link_runs_no_key_alongside_another(
    private_broker: RabbitNode, tmp_path: Path
) -> None:
    # Worker 0's link to the store stops forwarding (no reset) for more than
    # two leases while it runs handlers; the other worker reaches the store.
    config = ChaosConfig(
        store=BLACKHOLE_STORE,
        fault=BLACKHOLE,
        messages=300,
        workers=2,
        kills=0,
        seed=7,
        rate=40,
        stall=6.0,
        outage_when_running=4,
        drain_deadline=60,
        keep=tmp_path,
    )
    report = await run_chaos(config, private_broker)
    table = show(report)
    print(table)

    assert report.drained, f"keys still unsettled after the drain deadline\n{table}"
    assert report.verdict.lost == [], table
    # Two executions of one key at once, or any other rerun the stall does
    # not explain, is unexplained.
    assert report.verdict.count(UNEXPLAINED) == 0, table
    assert report.outages == 1, table


@pytest.mark.timeout(120)
async def test_plain_handlers_run_no_key_twice_under_rolling_restarts(
    private_broker: RabbitNode, tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    # A thread cannot be cancelled: a worker SIGTERMed with a grace shorter
    # than its handlers must neither free a key whose thread still runs nor
    # hand back work its thread finished.
    if rabbitmq_lane(pytestconfig) != "3":
        pytest.skip("the shutdown path does not depend on the broker's version: one lane")
    config = ChaosConfig(
        store=ROLLING_STORE,
        fault=ROLLING,
        messages=600,
        workers=2,
        kills=6,
        terms=6,
        seed=1,
        rate=60,
        drain_deadline=60,
        keep=tmp_path,
    )
    report = await run_chaos(config, private_broker)
    table = show(report)
    print(table)

    assert report.drained, f"keys still unsettled after the drain deadline\n{table}"
    assert report.verdict.lost == [], table
    assert report.verdict.count(UNEXPLAINED) == 0, table
    assert report.overlaps == 0, table
    assert report.terms == config.terms, table
    assert report.kills == config.kills, table


@pytest.mark.timeout(150)
@pytest.mark.parametrize("store", REPLICATED_REDIS)
async def test_a_primary_killed_mid_flow_loses_and_repeats_nothing_when_a_replica_acknowledges(
    store: str, private_broker: RabbitNode, tmp_path: Path
) -> None:
    config = ChaosConfig(
        store=store,
        messages=300,
        workers=2,
        kills=2,
        seed=7,
        rate=30,
        outage_when_running=2,
        drain_deadline=60,
        keep=tmp_path,
        replicas_ack=1,
    )
    report = await run_chaos(config, private_broker)
    table = show(report)
    print(table)

    assert report.drained, f"keys still unsettled after the drain deadline\n{table}"
    assert report.verdict.lost == [], table
    assert report.verdict.count(UNEXPLAINED) == 0, table
    # Every write waited for the replica that was promoted: none died with the primary.
    assert report.verdict.count(UNREPLICATED) == 0, table
    assert report.overlaps == 0, table
    # The primary did die while handlers ran, and was replaced.
    [failover] = report.failovers
    first, last = report.flow
    assert first < failover.killed < last, table
    assert failover.promoted > failover.killed, table
    assert report.outages == 1, table
    assert report.kills == config.kills, table
    sent = report.sent
    assert (sent.total - sent.originals) / sent.total >= 0.3, table
