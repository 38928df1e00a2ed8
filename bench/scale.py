"""``python -m bench.scale``: one, two and three consumer processes on one queue, Redis.

For each number of processes, the bare aio-pika consumer and semel's worker
(unique keys) drain the same N messages, one case after the other in each
repeat. Beside each drain's msg/s: the CPU per message of the consumers, of
the broker (the ``beam.smp`` serving :5672) and of the store (the
``redis-server`` serving :6379), from ``/proc``. The side whose CPU per
message times the rate reaches a whole core is where the limit is: on a
2-core machine the broker, the store and the consumers share the same two.

    .venv/bin/python -m bench.scale --messages 30000 --repeat 3 --procs 1,2,3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.backends import Backends
from bench.broker import Batch, Broker
from bench.children import Group, start_baseline, start_semel

LOGS = Path("bench/out/scale-logs")  # a consumer's log is kept only when it failed
TICKS = os.sysconf("SC_CLK_TCK")
KINDS = ("baseline", "semel-redis")


def listener_pid(port: int) -> int:
    """The pid of the process listening on ``port`` on this machine (``ss -ltnp``)."""
    out = subprocess.run(
        ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"pid=(\d+)", out)
    if found is None:
        raise SystemExit(f"nothing listens on :{port}")
    return int(found.group(1))


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass(slots=True)
class Figures:
    rates: list[float] = field(default_factory=list)
    consumer_us: list[float] = field(default_factory=list)
    broker_us: list[float] = field(default_factory=list)
    store_us: list[float] = field(default_factory=list)


async def drain(
    broker: Broker, backends: Backends, kind: str, procs: int, n: int, servers: dict[str, int]
) -> tuple[float, float, float, float]:
    settings = backends.settings("redis", f"scale-{kind}-{procs}")
    await broker.declare(settings)
    if kind != "baseline":
        await backends.migrate(settings)
    await broker.publish(settings.exchange, Batch("k", n))
    start = start_baseline if kind == "baseline" else start_semel
    before = {name: cpu_seconds(pid) for name, pid in servers.items()}
    group = Group([start(f"{settings.queue}.{i}", settings, LOGS) for i in range(procs)])
    try:
        timed = await broker.time_drain(settings.queue, n, group)
    finally:
        codes = group.stop()
        after = {name: cpu_seconds(pid) for name, pid in servers.items()}
        left = await broker.leftovers(settings)
        await broker.delete(settings)
        if any(codes) or left:
            print(f"  {kind} x{procs}: exit {codes}, left {left}; logs in {LOGS}")
        else:
            for child in group.children:
                child.discard_log()
    # The servers' CPU is counted from the consumers' start to their stop: it
    # includes their start-up, so it is an upper bound per message.
    per = {name: (after[name] - before[name]) / n * 1e6 for name in servers}
    return n / timed.seconds, timed.cpu_seconds / n * 1e6, per["broker"], per["store"]


async def measure(n: int, repeat: int, procs: list[int]) -> dict[tuple[str, int], Figures]:
    servers = {"broker": listener_pid(5672), "store": listener_pid(6379)}
    results: dict[tuple[str, int], Figures] = {(k, p): Figures() for p in procs for k in KINDS}
    with Backends(["redis"]) as backends:
        broker = await Broker.open()
        try:
            for index in range(repeat):
                for p in procs:
                    for kind in KINDS:
                        rate, consumer, on_broker, on_store = await drain(
                            broker, backends, kind, p, n, servers
                        )
                        figures = results[(kind, p)]
                        figures.rates.append(rate)
                        figures.consumer_us.append(consumer)
                        figures.broker_us.append(on_broker)
                        figures.store_us.append(on_store)
                        print(
                            f"[{index + 1}/{repeat}] {kind} x{p}: {rate:,.0f} msg/s, CPU µs/msg "
                            f"consumers {consumer:.0f}, broker {on_broker:.0f}, "
                            f"store {on_store:.0f}"
                        )
        finally:
            await broker.close()
    return results


def report(results: dict[tuple[str, int], Figures], procs: list[int]) -> Table:
    table = Table(title="one queue, N consumer processes (medians; CPU µs per message)")
    for column in ("case", "msg/s", "÷ bare x1", "÷ same x1", "consumers", "broker", "store"):
        table.add_column(column, justify="left" if column == "case" else "right")
    base = statistics.median(results[("baseline", procs[0])].rates)
    for kind in KINDS:
        first = statistics.median(results[(kind, procs[0])].rates)
        for p in procs:
            f = results[(kind, p)]
            rate = statistics.median(f.rates)
            table.add_row(
                f"{kind} x{p}",
                f"{rate:,.0f}",
                f"{rate / base:.2f}",
                f"{rate / first:.2f}",
                f"{statistics.median(f.consumer_us):.0f}",
                f"{statistics.median(f.broker_us):.0f}",
                f"{statistics.median(f.store_us):.0f}",
            )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--messages", type=int, default=30_000, help="messages per drain")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case (3)")
    parser.add_argument("--procs", default="1,2,3", help="process counts (1,2,3)")
    options = parser.parse_args()
    procs = sorted({int(p) for p in options.procs.split(",")})
    if procs[0] < 1 or options.messages < 1 or options.repeat < 1:
        parser.error("--procs, --messages and --repeat must be positive")
    results = asyncio.run(measure(options.messages, options.repeat, procs))
    Console(width=120).print(report(results, procs))


if __name__ == "__main__":
    main()
