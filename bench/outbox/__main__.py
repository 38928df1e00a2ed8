"""``python -m bench.outbox``: publish latency and relay throughput of the outbox, one run.

.venv/bin/python -m bench.outbox                      # 200 msg/s for 20 s, 20,000 rows x 3
.venv/bin/python -m bench.outbox --rate 100 --seconds 30 --messages 50000 --relays 1
.venv/bin/python -m bench.outbox --profile bench/out/outbox-profiles   # cProfile the relays
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import psutil
from psycopg import AsyncConnection
from rich.console import Console

from bench.broker import BenchError
from bench.outbox import latency, throughput
from bench.outbox.report import BASELINE, HERE, Results, publish
from bench.outbox.scene import Scene
from semel.consumer.outbox.relay import BATCH  # the relay's rows per pass

LOOP_FACTORY: Callable[[], asyncio.AbstractEventLoop] | None = None
try:
    import uvloop

    # The relays run on uvloop (as `semel relay` and the worker do): so does the baseline.
    LOOP_FACTORY = uvloop.new_event_loop
except ImportError:
    pass


def relay_counts(value: str) -> list[int]:
    counts = [int(v) for v in value.split(",") if v.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"relay counts are positive integers; got {value!r}")
    return counts


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.outbox", description=__doc__)
    parser.add_argument("--rate", type=float, default=200.0, help="latency: messages/s (200)")
    parser.add_argument("--seconds", type=float, default=20.0, help="latency: per mode (20)")
    parser.add_argument("--messages", type=int, default=20_000, help="throughput: rows (20,000)")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs; medians count")
    parser.add_argument(
        "--relays", type=relay_counts, default=[1, 2], help="relays draining at once (1,2)"
    )
    parser.add_argument(
        "--batch", type=int, default=BATCH, help=f"the baseline's messages at once ({BATCH})"
    )
    parser.add_argument("--skip", choices=("latency", "throughput"), action="append", default=[])
    parser.add_argument(
        "--profile",
        type=Path,
        help="run the child relays under cProfile, one .prof each here (python -m bench.profiles "
        "reads them); the figures of such a run are not comparable",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out"), help="outbox.json here")
    args = parser.parse_args(argv)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    if args.rate <= 0 or args.seconds <= 0 or args.messages < 1 or args.repeat < 1:
        parser.error("--rate, --seconds, --messages and --repeat must be positive")
    return args


def phase(results: Results, console: Console, name: str) -> None:
    """Say what starts now, with the machine's load then (kept in the JSON)."""
    load = os.getloadavg()[0]
    results.meta.setdefault("phase_loads", {})[name] = load
    console.print(f"{name} (load average {load:.2f}) ...")


async def servers(scene: Scene, connection: Any) -> dict[str, str]:
    async with await AsyncConnection.connect(scene.postgres_dsn) as conn:
        row = await (await conn.execute("SHOW server_version")).fetchone()
    properties = connection.transport.connection.server_properties
    return {
        "python": platform.python_version(),
        "postgresql": str(row[0]) if row else "?",
        "rabbitmq": str(properties.get("version", "?")),
        "loop": "uvloop" if LOOP_FACTORY else "asyncio",
    }


async def measure(args: argparse.Namespace, results: Results, console: Console) -> None:
    scene = Scene.fresh()
    logs = args.out / f"outbox-{scene.run_id}"
    logs.mkdir(parents=True, exist_ok=True)
    connection = await aio_pika.connect(scene.amqp_url)
    channel = await connection.channel()
    try:
        await scene.create(channel)
        results.meta |= {"run_id": scene.run_id} | await servers(scene, connection)
        if "latency" not in args.skip:
            for listen in (True, False):
                await scene.empty(channel)
                phase(results, console, f"latency, LISTEN/NOTIFY {'on' if listen else 'off'}")
                run = await latency.measure_relay(
                    scene, connection, listen=listen, rate=args.rate, seconds=args.seconds,
                    logs=logs, profile=args.profile,
                )  # fmt: skip
                results.latency.append(run)
            await scene.empty(channel)
            phase(results, console, "latency, publish_confirmed directly")
            results.direct_latency = await latency.measure_direct(
                scene, connection, rate=args.rate, seconds=args.seconds
            )
        if "throughput" not in args.skip:
            await _throughput(args, scene, connection, channel, results, console, logs)
    finally:
        await scene.remove(connection)
        await connection.close()
    if not any(logs.iterdir()):
        logs.rmdir()


async def _throughput(args: argparse.Namespace, scene: Scene, connection: Any, channel: Any,
                      results: Results, console: Console, logs: Path) -> None:  # fmt: skip
    for repeat in range(args.repeat):
        await scene.empty(channel)
        phase(results, console, f"throughput {repeat + 1}: publish_confirmed directly")
        rate = await throughput.publish_directly(scene, connection, args.messages, args.batch)
        results.throughput.setdefault(BASELINE, []).append(rate)
        await scene.empty(channel)
        results.staging_per_s.append(await throughput.stage_rows(scene, args.messages))
        phase(results, console, f"throughput {repeat + 1}: engine.relay() in this process")
        rate = await throughput.drain_here(scene, connection, args.messages)
        results.throughput.setdefault(HERE, []).append(rate)
        for count in args.relays:
            await scene.empty(channel)
            results.staging_per_s.append(await throughput.stage_rows(scene, args.messages))
            phase(results, console, f"throughput {repeat + 1}: {count} relay(s)")
            tag = f"relays-{count}"
            rate = await throughput.drain(
                scene, connection, total=args.messages, relays=count, logs=logs,
                tag=f"{tag}-{repeat}", profile=args.profile,
            )  # fmt: skip
            results.throughput.setdefault(tag, []).append(rate)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m bench.outbox", shlex.join(given)]).strip()
    results = Results(
        meta={
            "command": command,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpus": psutil.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "load_before": os.getloadavg(),
            "rate": args.rate,
            "seconds": args.seconds,
            "messages": args.messages,
            "repeat": args.repeat,
            "relay_batch": args.batch,
            "stage_batch": throughput.STAGE_BATCH,
        }
    )
    try:
        with asyncio.Runner(loop_factory=LOOP_FACTORY) as runner:
            runner.run(measure(args, results, console))
    except BenchError as exc:
        console.print(f"[red]benchmark failed:[/] {exc}")
        return 1
    results.meta["load_after"] = os.getloadavg()
    publish(results, args.out, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
