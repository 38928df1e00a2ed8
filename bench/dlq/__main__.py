"""``python -m bench.dlq``: see :mod:`bench.dlq`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import orjson
import psutil
from aio_pika.abc import AbstractIncomingMessage
from rich.console import Console
from rich.table import Table

import bench.dlq
from bench.broker import AMQP_URL, BenchError, Broker
from bench.children import semel_env
from bench.dlq.command import Outcome, run_semel, stop
from bench.dlq.letters import BURST, Kind, key_of, plan, seed
from bench.dlq.steps import Step, steps
from semel.consumer import names
from semel.consumer.names import Topology
from semel.settings import Settings

SETTLE = 15.0  # seconds the DLQ's depth and the copies get to become what they should
RATE_TOLERANCE = 0.10


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dlq",
        description=bench.dlq.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--letters", type=int, help="dead letters (100,000; quick: 2,000)")
    parser.add_argument("--rate", type=float, help="the paced replay's copies/s (200; quick: 50)")
    parser.add_argument("--poll", type=float, default=0.5, help="s between rabbitmqctl polls")
    parser.add_argument("--quick", action="store_true", help="the smoke run's defaults")
    parser.add_argument("--out", type=Path, default=Path("bench/out"), help="dlq.json here")
    args = parser.parse_args(argv)
    args.given = argv
    args.letters = args.letters or (2_000 if args.quick else 100_000)
    args.rate = args.rate or (50.0 if args.quick else 200.0)
    if args.letters < 100 or args.rate <= 0 or args.poll <= 0:
        parser.error("--letters must be 100 or more, --rate and --poll positive")
    return args


@dataclass(slots=True)
class Copies:
    """The replay's copies as they reach the bench's consumer of the ``--to`` queue."""

    expected: int
    times: list[float] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    replays: Counter[object] = field(default_factory=Counter)
    all_in: asyncio.Event = field(default_factory=asyncio.Event)

    async def arrived(self, message: AbstractIncomingMessage) -> None:
        self.times.append(time.monotonic())
        headers = message.headers or {}
        self.keys.append(str(headers.get("Idempotency-Key")))
        self.replays[headers.get(names.H_REPLAYS)] += 1
        if len(self.keys) >= self.expected:
            self.all_in.set()

    def rate(self) -> float:
        span = self.times[-1] - self.times[0] if len(self.times) > 1 else 0.0
        return (len(self.times) - 1) / span if span > 0 else 0.0

    def tightest(self, run: int) -> float | None:
        """Milliseconds between the first and the last of the ``run`` copies that arrived
        closest together (at the rate asked: ``run - 1`` gaps)."""
        spans = [b - a for a, b in zip(self.times, self.times[run - 1 :], strict=False)]
        return round(min(spans) * 1000, 1) if spans else None

    async def problems(self, burst: set[str], rate: float) -> list[str]:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.all_in.wait(), SETTLE)
        found: list[str] = []
        if sorted(self.keys) != sorted(burst):
            found.append(f"{len(self.keys)} copies arrived, not the burst's {len(burst)} once")
        if set(self.replays) != {1}:
            found.append(f"x-semel-replays on the copies: {dict(self.replays)}, not all 1")
        # --rate is a ceiling: a turn that reads the letters more slowly than
        # the rate (a loaded machine, a burst spread thin) sends more slowly.
        if self.rate() > rate * (1 + RATE_TOLERANCE):
            found.append(f"copies arrived at {self.rate():.1f}/s, above {rate:g}/s + 10 %")
        return found


async def settled_depth(broker: Broker, queue: str, wanted: int) -> int:
    """``queue``'s depth once it is ``wanted``, or after ``SETTLE`` s of something else."""
    deadline = time.monotonic() + SETTLE
    while True:
        got = await broker.ready(queue)
        if got == wanted or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.1)


def row(
    step: Step, letters: int, outcome: Outcome, depth: int, problems: list[str]
) -> dict[str, Any]:
    return {
        "command": step.name,
        "argv": shlex.join(["semel", *step.args]),
        "exit": outcome.code,
        "wall_s": round(outcome.wall_s, 3),
        "letters_per_s": round(letters / outcome.wall_s),
        "cpu_s": round(outcome.cpu_s, 2),
        "peak_rss_mib": round(outcome.peak_rss_mib, 1),
        "max_unacked": outcome.max_unacked,
        "unacked_polls": outcome.polls,
        "dlq_after": depth,
        "problems": problems,
        "stdout_head": outcome.stdout[:2000],
        "stderr_tail": outcome.stderr[-2000:],
    }


async def measure(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    queue = f"bench.dlq.{uuid.uuid4().hex[:8]}"
    to, kinds, live = f"{queue}.replayed", plan(args.letters), set[int]()
    dlq = Topology(queue).dead_letter_queue
    results: dict[str, Any] = {"meta": meta(args, queue, kinds), "runs": []}
    with tempfile.TemporaryDirectory() as home:
        settings = Settings(amqp_url=AMQP_URL, queue=queue, exchange=f"{queue}.events",
                            sqlite_path=str(Path(home) / "keys.db"))  # fmt: skip
        env = semel_env(settings) | {"COLUMNS": "160"}
        broker = await Broker.open()
        connection = await aio_pika.connect(AMQP_URL)
        channel = await connection.channel()
        try:
            results["meta"]["rabbitmq"] = version(connection)
            await broker.declare(settings)
            await channel.declare_queue(to, durable=True)
            seconds = await seed(connection, settings, kinds)
            if (depth := await settled_depth(broker, dlq, len(kinds))) != len(kinds):
                raise BenchError(f"seeded {len(kinds)} letters, the DLQ holds {depth}")
            results["seed"] = {"seconds": round(seconds, 2), "per_s": round(len(kinds) / seconds)}
            console.print(f"seeded {len(kinds):,} letters in {seconds:.1f} s")
            burst = {key_of(i) for i, kind in enumerate(kinds) if kind is BURST}
            copies = Copies(len(burst))
            await (await channel.get_queue(to)).consume(copies.arrived, no_ack=True)
            for step in steps(kinds, args.rate, to):
                console.print(f"{step.name} ...")
                outcome = await asyncio.to_thread(run_semel, step.args, env, args.poll, live)
                problems = [f"exit {outcome.code}"] if outcome.code else []
                problems += step.says(outcome.stdout)
                depth = await settled_depth(broker, dlq, step.depth)
                if depth != step.depth:
                    problems.append(f"the DLQ holds {depth}, not {step.depth}")
                if "--to" in step.args:
                    problems += await copies.problems(burst, args.rate)
                    results["copies_per_s"] = round(copies.rate(), 1)
                    results["copies_tightest_10_ms"] = copies.tightest(10)
                results["runs"].append(row(step, len(kinds), outcome, depth, problems))
        finally:
            await stop(live)
            await channel.close()  # and its consumer of the copies with it
            await (await connection.channel()).queue_delete(to)
            await broker.delete(settings)
            await connection.close()
            await broker.close()
    return results


def version(connection: Any) -> str:
    properties = connection.transport.connection.server_properties
    return str(properties.get("version", "?"))


def meta(args: argparse.Namespace, queue: str, kinds: list[Kind]) -> dict[str, Any]:
    return {
        "command": shlex.join(["python", "-m", "bench.dlq", *args.given]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": psutil.cpu_count(),
        "load_before": os.getloadavg(),
        "queue": queue,
        "letters": len(kinds),
        "groups": {kind.group_id: n for kind, n in Counter(kinds).most_common()},
        "burst_group": BURST.group_id,
        "rate": args.rate,
        "poll_s": args.poll,
    }


def publish(results: dict[str, Any], out: Path, console: Console) -> None:
    results["meta"]["load_after"] = os.getloadavg()
    out.mkdir(parents=True, exist_ok=True)
    (out / "dlq.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    table = Table("command", "wall s", "letters/s", "CPU s", "peak RSS MiB",
                  "most unacked (polls)", "DLQ after", "check")  # fmt: skip
    for run in results["runs"]:
        table.add_row(
            run["command"], f"{run['wall_s']:.1f}", f"{run['letters_per_s']:,}",
            f"{run['cpu_s']:.1f}", f"{run['peak_rss_mib']:.0f}",
            f"{run['max_unacked'] if run['max_unacked'] is not None else '-'} "
            f"({run['unacked_polls']})", f"{run['dlq_after']:,}",
            "ok" if not run["problems"] else "; ".join(run["problems"]),
        )  # fmt: skip
    console.print(table)
    meta = results["meta"]
    console.print(
        f"{meta['letters']:,} letters seeded at {results['seed']['per_s']:,}/s; replay copies "
        f"arrived at {results.get('copies_per_s', 0):g}/s (asked {meta['rate']:g}/s); "
        f"RabbitMQ {meta['rabbitmq']}, {meta['cpus']} cores, load {meta['load_before'][0]:.1f} "
        f"before, {meta['load_after'][0]:.1f} after; {out / 'dlq.json'}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    try:
        results = asyncio.run(measure(args, console))
    except BenchError as exc:
        console.print(f"[red]benchmark failed:[/] {exc}")
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("interrupted: everything the run created was deleted")
        return 130
    publish(results, args.out, console)
    return 1 if any(run["problems"] for run in results["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
