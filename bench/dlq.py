"""``python -m bench.dlq``: the operator commands on a large dead-letter stream, one run.

.venv/bin/python -m bench.dlq                       # 100,000 letters
.venv/bin/python -m bench.dlq --letters 20000 --rate 500

Fills a private queue's dead-letter stream with letters shaped like an
incident's (three failing handlers, bad input, a spread of two hours), then
times the commands an operator runs, each as its own ``semel`` process:
wall time, that process's CPU and its peak memory. The baseline, in this
process, is a bare read of the same stream to its end (no folding, no
filters): each command's wall time is printed as a multiple of it. Nothing is
asserted; the figures are for the README.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aio_pika
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage
from rich.console import Console
from rich.table import Table

from semel.consumer.broker.copies import new_letter_id, stream_safe_headers
from semel.consumer.broker.topology import TopologySpec, declare, queue_specs
from semel.consumer.names import DLQ_ROUTING_KEY, H_DLQ_EVENT, Topology

AMQP = os.environ.get("SEMEL_AMQP_URL", "amqp://guest:guest@localhost:5672/")
SEMEL = str(Path(sys.executable).with_name("semel"))
_FAILURES = (
    ("max-attempts", "httpx.ConnectError", "shop.payments:Gateway.charge:41"),
    ("max-attempts", "httpx.ReadTimeout", "shop.payments:Gateway.charge:44"),
    ("permanent-error", "shop.errors.CardDeclined", "shop.payments:charge:12"),
    ("invalid-body", None, None),
    ("poison", None, None),
)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.dlq", description=__doc__)
    parser.add_argument("--letters", type=int, default=100_000, help="dead letters (100,000)")
    parser.add_argument(
        "--rate", type=float, default=2000.0, help="the paced replay's rate, of one fifth (2,000/s)"
    )
    return parser.parse_args(argv)


def letter(i: int, names: Topology, exchange: str, now: datetime) -> aio_pika.Message:
    reason, error_type, frame = _FAILURES[i % len(_FAILURES)]
    headers: dict[str, object] = {
        "Idempotency-Key": f"order-{i}",
        "x-semel-reason": reason,
        "x-semel-key": f"order-{i}",
        "x-semel-attempts": 5,
        "x-semel-error": f"{error_type or reason}: order {i} failed downstream",
        "x-semel-dead-lettered-at": (now - timedelta(seconds=i * 7200 / 100_000)).isoformat(),
        "x-semel-original-exchange": exchange,
        "x-semel-original-routing-key": f"orders.created.{i % 7}",
        "tenant": {"id": i % 13, "tags": ["a", "b"]},  # a table: travels encoded
    }
    if error_type is not None:
        headers["x-semel-error-type"] = error_type
        headers["x-semel-error-frame"] = frame
    safe = stream_safe_headers(headers)
    safe["x-semel-letter-id"] = new_letter_id()
    body = json.dumps({"order": i, "amount": i % 997, "lines": ["sku-1", "sku-2"] * 8}).encode()
    return aio_pika.Message(
        body,
        headers=safe,
        message_id=uuid.uuid4().hex,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


async def fill(connection: AbstractConnection, spec: TopologySpec, count: int) -> float:
    channel = await connection.channel(publisher_confirms=True)
    dlx = await channel.get_exchange(spec.names.dead_letter_exchange)
    now = datetime.now(UTC)
    started = time.perf_counter()
    for start in range(0, count, 500):
        batch = range(start, min(count, start + 500))
        await asyncio.gather(
            *(
                dlx.publish(letter(i, spec.names, spec.exchange, now), DLQ_ROUTING_KEY)
                for i in batch
            )
        )
    await channel.close()
    return time.perf_counter() - started


async def bare_read(connection: AbstractConnection, names: Topology) -> tuple[float, int]:
    """Read the stream to a mark with nothing else done: the baseline."""
    started = time.perf_counter()
    channel = await connection.channel(publisher_confirms=True)
    mark = uuid.uuid4().hex
    await channel.default_exchange.publish(
        aio_pika.Message(
            json.dumps({"mark": mark}).encode(), headers={H_DLQ_EVENT: "mark"}, message_id=mark
        ),
        names.dead_letter_log,
    )
    await channel.set_qos(prefetch_count=1000)
    stream = await channel.declare_queue(names.dead_letter_log, passive=True)
    end: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    seen = 0

    async def on_record(message: AbstractIncomingMessage) -> None:
        nonlocal seen
        seen += 1
        if seen % 250 == 0 or message.message_id == mark:
            await message.ack(multiple=True)
        if message.message_id == mark and not end.done():
            end.set_result(seen)

    await stream.consume(on_record, arguments={"x-stream-offset": "first"})
    records = await asyncio.wait_for(end, 600)
    await channel.close()
    return time.perf_counter() - started, records


@dataclass
class Run:
    what: str
    command: str
    wall: float
    cpu: float
    rss_mib: float
    answer: str


async def semel(env: dict[str, str], what: str, *args: str) -> Run:
    """Run one command; the loop goes on meanwhile, so this process's connection
    keeps its heartbeats."""
    return await asyncio.to_thread(_semel, env, what, *args)


def _semel(env: dict[str, str], what: str, *args: str) -> Run:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([SEMEL, *args], env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"semel {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    answer = done.stdout.strip().splitlines()[0][:70] if done.stdout.strip() else ""
    # ru_maxrss of children is the largest any child reached so far: each command
    # runs after the smaller ones, so this is close to its own peak.
    return Run(what, "semel " + " ".join(args), wall, cpu, after.ru_maxrss / 1024, answer)


async def cleanup(connection: AbstractConnection, spec: TopologySpec) -> None:
    channel = await connection.channel()
    for queue in queue_specs(spec):
        await channel.queue_delete(queue.name)
    for exchange in (spec.exchange, spec.names.retry_exchange, spec.names.dead_letter_exchange):
        await channel.exchange_delete(exchange)
    await channel.close()


async def main(options: argparse.Namespace) -> None:
    queue = f"bench-dlq-{os.getpid()}"
    spec = TopologySpec(queue=queue, exchange=f"{queue}.x")
    connection = await aio_pika.connect(AMQP)
    console = Console(width=150)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as home:
        env = os.environ | {
            "SEMEL_QUEUE": queue,
            "SEMEL_EXCHANGE": spec.exchange,
            "SEMEL_STORE": "sqlite",
            "SEMEL_SQLITE_PATH": str(Path(home) / "keys.db"),
            "SEMEL_AMQP_URL": AMQP,
        }
        try:
            await declare(connection, spec)
            filled = await fill(connection, spec, options.letters)
            console.print(f"filled {options.letters:,} letters in {filled:.1f} s")
            bare, records = await bare_read(connection, spec.names)
            console.print(f"baseline: a bare read of {records:,} records in {bare:.1f} s")
            runs.append(await semel(env, "list", "dlq", "list", "--limit", "20"))
            runs.append(await semel(env, "groups", "dlq", "groups"))
            runs.append(await semel(env, "list, filtered", "dlq", "list", "--reason", "poison"))
            runs.append(await semel(env, "replay dry run", "dlq", "replay", "--all", "--dry-run"))
            paced = options.letters // len(_FAILURES)
            rate = str(options.rate)
            what = f"replay {paced:,} at {options.rate:g}/s"
            paced_args = ("dlq", "replay", "--reason", "poison", "--rate", rate)
            runs.append(await semel(env, what, *paced_args))
            runs.append(await semel(env, "replay the rest", "dlq", "replay", "--all"))
            runs.append(await semel(env, "list (all replayed)", "dlq", "list"))
        finally:
            await cleanup(connection, spec)
            await connection.close()
    table = Table("command", "wall s", "x bare read", "CPU s", "peak MiB", "answer")
    for run in runs:
        table.add_row(
            run.what,
            f"{run.wall:.1f}",
            f"{run.wall / bare:.2f}",
            f"{run.cpu:.1f}",
            f"{run.rss_mib:.0f}",
            run.answer,
        )
    console.print(table)
    console.print(
        f"{options.letters:,} letters, {datetime.now(UTC):%Y-%m-%d}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
