"""``semel publish`` through a node's death: every message confirmed or reported failed.

The command runs as an operator runs it, a process with ``SEMEL_AMQP_URL``
naming the three nodes, publishing distinct keys at a steady rate. Once a
share of them is confirmed, the node its connection is on is SIGKILLed.
Its report must then account for every message (confirmed, returned,
nacked, failed for want of an answer, or not sent), and every message it
reports confirmed must be in the work queue once the node is back: a
confirm from a quorum queue means a majority of the nodes has the message,
which one node's death cannot take away.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika

from semel.consumer.broker.topology import declare
from semel.consumer.plan import topology_of
from semel.settings import Settings
from tests.chaos.producer import KEY_HEADER
from tests.conftest import settings_env
from tests.rabbit_cluster import ClusterNode, RabbitCluster
from tests.servers import ROOT

KILL_AFTER = 0.3  # share of the messages confirmed (in the queue) before the node dies
EXIT_DEADLINE = 120.0  # seconds the command may take in all


@dataclass(slots=True)
class PublishProof:
    """What the command said, and what the queue holds."""

    count: int
    code: int | None = None
    report: dict[str, Any] | None = None  # the command's --json summary
    stderr: str = ""
    killed: str = ""  # the node its connection was on
    in_queue_at_kill: int = 0
    keys_in_queue: set[str] = field(default_factory=set)
    confirmed_missing: list[str] = field(default_factory=list)  # confirmed, not in the queue
    wall: float = 0.0

    @property
    def accounted(self) -> int:
        """Messages the report gives an outcome to (not sent included)."""
        if self.report is None:
            return 0
        outcomes = ("confirmed", "returned", "nacked", "failed", "not_sent")
        return sum(int(self.report.get(name, 0)) for name in outcomes)

    @property
    def ok(self) -> bool:
        return (
            self.report is not None
            and self.accounted == self.count
            and not self.confirmed_missing
            and self.code == (0 if self.report.get("confirmed") == self.count else 1)
        )


def _settings(cluster: RabbitCluster, run: str, workdir: Path) -> Settings:
    return Settings(
        amqp_url=cluster.url,
        queue=f"pub.{run}.work",
        exchange=f"pub.{run}.events",
        sqlite_path=str(workdir / "unused.db"),
        metrics_port=0,
    )


async def publish_through_a_node_death(
    cluster: RabbitCluster, workdir: Path, count: int = 3000, rate: float = 300.0
) -> PublishProof:
    began = time.monotonic()
    await cluster.restore()  # whole, whatever an earlier run left
    run = uuid.uuid4().hex[:8]
    settings = _settings(cluster, run, workdir)
    first = cluster.nodes[0]
    connection = await aio_pika.connect(first.url)
    await declare(connection, topology_of(settings))
    await connection.close()  # the command's is then the only connection: its node is found

    proof = PublishProof(count)
    prefix = f"pub-{run}"
    argv = [sys.executable, "-m", "semel.consumer.commands.app", "publish", "--count", str(count),
            "--key-prefix", prefix, "--rate", f"{rate:g}", "--json", "--no-progress"]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *argv, env=settings_env(settings), cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        node = await _node_of_the_only_connection(cluster, 30)
        proof.killed = node.name
        observer = next(n for n in cluster.nodes if n is not node)
        proof.in_queue_at_kill = await _await_depth(observer, settings.queue, count * KILL_AFTER)
        await cluster.kill(node)
        out, err = await asyncio.wait_for(proc.communicate(), EXIT_DEADLINE)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    proof.code = proc.returncode
    proof.stderr = err.decode(errors="replace").strip()
    try:
        proof.report = json.loads(out)
    except ValueError:
        proof.report = None
    await cluster.start_node(node)
    await cluster.await_running(60)
    proof.keys_in_queue = await _keys_in(observer, settings.queue)
    if proof.report is not None:
        proof.confirmed_missing = sorted(_confirmed(proof.report, prefix) - proof.keys_in_queue)
    proof.wall = time.monotonic() - began
    return proof


def _confirmed(report: dict[str, Any], prefix: str) -> set[str]:
    """The keys the command reports confirmed: it sends prefix-1, prefix-2, ... in order,
    so the published ones are the first ``published``, less those without a confirm."""
    published = {f"{prefix}-{n}" for n in range(1, int(report["published"]) + 1)}
    return published - set(report.get("failed_keys", []))


async def _node_of_the_only_connection(cluster: RabbitCluster, deadline: float) -> ClusterNode:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        found = [node for node, _host, _port in await cluster.connections() if node is not None]
        if len(found) == 1:
            return found[0]
        await asyncio.sleep(0.2)
    raise RuntimeError(f"semel publish not connected after {deadline:g}s")


async def _await_depth(node: ClusterNode, queue: str, least: float) -> int:
    connection = await aio_pika.connect(node.url)
    try:
        channel = await connection.channel()
        end = time.monotonic() + 60
        while True:
            declared = await channel.declare_queue(queue, passive=True)
            depth = int(declared.declaration_result.message_count or 0)
            if depth >= least or time.monotonic() > end:
                return depth
            await asyncio.sleep(0.1)
    finally:
        await connection.close()


async def _keys_in(node: ClusterNode, queue: str) -> set[str]:
    """Every key in ``queue``, read off by basic.get (each message taken)."""
    connection = await aio_pika.connect(node.url)
    keys = set()
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        while (message := await declared.get(no_ack=True, fail=False)) is not None:
            keys.add(str((message.headers or {}).get(KEY_HEADER)))
    finally:
        await connection.close()
    return keys
