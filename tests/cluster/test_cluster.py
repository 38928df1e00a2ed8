"""semel on a real three-node cluster: a storm, a rolling restart, a partition, a publisher.

One cluster serves the module (about 15 s to start); each test is one run of
``python -m tests.cluster`` (see its docstring for what each does), 2000
messages with 40 % duplicates (3000 in the storm), asserted on its figures.
The storm's two kills of the work queue's node include the single
``leader-kill`` run, which stays in the command. The cluster runs the
machine's RabbitMQ, so the RabbitMQ 4 lane skips these.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest
from rich.console import Console

from tests.chaos.verdict import UNEXPLAINED
from tests.cluster.faults import PARTITION, ROLLING
from tests.cluster.publish import publish_through_a_node_death
from tests.cluster.run import ClusterConfig, ClusterReport, run_cluster
from tests.cluster.storm import STORM
from tests.cluster.table import publish_table, runs_table, timelines
from tests.conftest import rabbitmq_lane
from tests.rabbit_cluster import NET_TICKTIME, RabbitCluster, missing

pytestmark = [
    pytest.mark.slow,
    # aiormq leaves its own Connection.close coroutine unawaited when a node
    # dies under a connection; the runs themselves check the outcome.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <coroutine object Connection.close"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
    pytest.mark.filterwarnings(
        "ignore:coroutine 'Connection.close' was never awaited:RuntimeWarning"
    ),
]

MESSAGES = 2000
SKIP_ENV = "SEMEL_CLUSTER_TESTS"
STORM_MESSAGES = 3000  # about 45 s of traffic: both kills and restarts meet it


@pytest.fixture(scope="module")
def cluster(pytestconfig: pytest.Config) -> Iterator[RabbitCluster]:
    if rabbitmq_lane(pytestconfig) == "4":
        pytest.skip("the cluster runs the machine's RabbitMQ (3.10)")
    if os.environ.get(SKIP_ENV) == "skip":
        # Slow and timing-bound: CI runs them once, in its first lane, not again
        # on the fresh machine (.ci/fresh-machine sets this).
        pytest.skip(f"{SKIP_ENV}=skip")
    why = missing()
    if why is not None:
        pytest.skip(f"no RabbitMQ cluster on this machine: {why}")
    started = asyncio.run(RabbitCluster.start())
    try:
        yield started
    finally:
        started.stop()


def show(report: ClusterReport) -> str:
    console = Console(width=140, record=True)
    console.print(runs_table([report]))
    for line in timelines([report]):
        console.print(line, markup=False)
    return console.export_text()


def assert_sound(report: ClusterReport) -> str:
    """What every run must show, whatever its fault; the table, for the messages."""
    table = show(report)
    print(table)  # shown by pytest when the test fails
    assert report.drained, f"keys still unsettled after the drain deadline\n{table}"
    assert report.verdict.lost == [], table
    assert report.verdict.parked == [], table
    assert report.overlaps == 0, table
    assert report.exits == 0, f"a worker exited\n{table}"  # consumers never exit
    sent = report.sent
    assert sent.total >= MESSAGES, table
    assert (sent.total - sent.originals) / sent.total >= 0.3, table
    assert sent.concurrent_copies > 0, table
    assert sent.late_copies > 0, table
    first = report.placed[0]
    assert any(node != first for node in report.placed.values()), table  # spread over nodes
    return table


@pytest.mark.timeout(60)
async def test_three_nodes_with_pause_minority_and_queues_on_every_node(
    cluster: RabbitCluster,
) -> None:
    assert await cluster.running_nodes() == {node.name for node in cluster.nodes}
    first = cluster.nodes[0]
    handling = await first.ctl("eval", "application:get_env(rabbit, cluster_partition_handling).")
    assert handling.strip() == "{ok,pause_minority}"
    tick = await first.ctl("eval", "net_kernel:get_net_ticktime().")
    assert tick.strip() == str(NET_TICKTIME)
    connection = await aio_pika.connect(first.url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(
            "cluster.members", durable=True, arguments={"x-queue-type": "quorum"}
        )
        out = await first.ctl("list_queues", "--formatter", "json", "name", "members")
        assert any(
            row["name"] == "cluster.members" and len(row["members"]) == 3 for row in json.loads(out)
        ), out
        await queue.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()


@pytest.mark.timeout(420)
async def test_a_storm_of_conflicts_while_the_queues_node_dies_twice_loses_and_holds_nothing(
    cluster: RabbitCluster, tmp_path: Path
) -> None:
    """The run that lost keys when the broker made semel's hops (messages held for
    dead-lettering after leader elections close together): now every hop is semel's.

    On quorum queues; ``python -m tests.cluster --faults storm --queue-type classic``
    runs it on classic ones (see the README for ten runs of each in a row).
    """
    config = ClusterConfig(STORM, messages=STORM_MESSAGES, keep=tmp_path)
    report = await run_cluster(config, cluster)
    table = assert_sound(report)
    # Every duplicate effect is a worker SIGKILLed after it, before its completion landed.
    assert report.verdict.count(UNEXPLAINED) == 0, table
    assert report.held is not None, table
    assert not any(report.held.values()), table
    kills = [what for _, what in report.record.events if "SIGKILLed" in what]
    assert len(kills) == 2, table
    assert report.record.during_traffic("SIGKILLed"), table  # both kills mid-traffic
    assert report.worker_kills >= 5, table
    assert report.conflicts >= 100, table  # conflict-heavy: copies parked by the hundred


@pytest.mark.timeout(300)
async def test_a_rolling_restart_loses_and_repeats_nothing(
    cluster: RabbitCluster, tmp_path: Path
) -> None:
    config = ClusterConfig(ROLLING, messages=MESSAGES, keep=tmp_path)
    report = await run_cluster(config, cluster)
    table = assert_sound(report)
    assert report.verdict.duplicates == [], table
    assert sum(1 for _, what in report.record.events if "start_app" in what) == 3, table
    assert report.record.during_traffic("stop_app"), table  # every node stopped mid-traffic
    assert sum(value or 0 for value in report.failovers.values()) >= 2, table


@pytest.mark.timeout(300)
async def test_a_partition_loses_nothing_and_repeats_only_what_the_lease_cannot_prevent(
    cluster: RabbitCluster, tmp_path: Path
) -> None:
    config = ClusterConfig(PARTITION, messages=MESSAGES, keep=tmp_path)
    report = await run_cluster(config, cluster)
    table = assert_sound(report)
    # Every duplicate effect is a worker cut off with the node, whose lease ran out.
    assert report.verdict.count("unexplained") == 0, table
    assert report.record.during_traffic("link down"), table
    events = [what for _, what in report.record.events]
    assert any("paused itself" in what for what in events), table
    assert report.record.ended - report.record.began > NET_TICKTIME, table
    # The worker outside the node's namespace gave the silent node up by itself.
    assert report.record.moved_after[1] is not None, table
    assert (report.failovers[1] or 0) >= 1, table


@pytest.mark.timeout(180)
async def test_semel_publish_reports_every_message_confirmed_or_failed_when_its_node_dies(
    cluster: RabbitCluster, tmp_path: Path
) -> None:
    proof = await publish_through_a_node_death(cluster, tmp_path)
    console = Console(width=140, record=True)
    console.print(publish_table(proof))
    table = console.export_text()
    print(table)
    assert proof.report is not None, table  # a summary, not only an error line
    assert proof.accounted == proof.count, table
    assert proof.confirmed_missing == [], table
    assert 0 < proof.report["confirmed"] < proof.count, table  # the node died mid-run
    assert proof.code == 1, table
