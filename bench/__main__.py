"""``python -m bench``: measure semel against a bare aio-pika consumer (with ``--front
faststream``, its FastStream middleware against a bare FastStream subscriber too); see
bench/README.md."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from rich.console import Console

from bench.backends import DYNAMODB_SERVERS, STORES
from bench.broker import BenchError
from bench.cases import FRONTS
from bench.report import publish
from bench.run import Plan, Runner

FULL = {"messages": 50_000, "repeat": 3, "rss": 100_000, "latency_seconds": 30.0}
QUICK = {"messages": 2_000, "repeat": 1, "rss": 1_000, "latency_seconds": 1.5}
LATENCY_RATE = 200.0  # messages/s of the latency phase: a light load
AGAINST_STORES = ("redis",)  # the stores another revision (--against) is measured with


def stores(value: str) -> list[str]:
    chosen = [s.strip() for s in value.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(STORES))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"stores are {', '.join(STORES)}; got {value!r}")
    return chosen


def parse(argv: list[str]) -> Plan:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--messages", type=int, help="messages per drain (default 50,000)")
    parser.add_argument("--repeat", type=int, help="runs of each case; the median counts (3)")
    parser.add_argument(
        "--quick", action="store_true", help="2,000 messages, one repeat: a smoke run"
    )
    parser.add_argument("--stores", type=stores, help="comma-separated (default: all)")
    parser.add_argument("--rss-messages", type=int, help="messages per long-run batch (100,000)")
    parser.add_argument(
        "--dynamodb-server",
        choices=sorted(DYNAMODB_SERVERS),
        default="moto",
        help="the local DynamoDB-compatible server (moto)",
    )
    parser.add_argument(
        "--front",
        choices=FRONTS,
        action="append",
        default=[],
        help="also measure this front: faststream = a bare FastStream subscriber, and the "
        "same with semel's middleware on each store",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="the FastStream front runs under cProfile, one .prof per drain in this folder "
        "(python -m bench.profiles reads them); its figures are then not comparable",
    )
    parser.add_argument(
        "--against",
        metavar="REF",
        action="append",
        default=[],
        help="also measure this git ref of semel (installed in a venv of its own, cached "
        "under ~/.cache/semel-bench), drain by drain beside this checkout; repeatable; "
        "Redis only",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out"), help="output folder")
    args = parser.parse_args(argv)
    if args.against:
        refuse_against(parser, args)
    sizes = QUICK if args.quick else FULL
    messages = args.messages or int(sizes["messages"])
    if messages < 1 or (args.repeat is not None and args.repeat < 1):
        parser.error("--messages and --repeat must be positive")
    if args.profile is not None and not args.front:
        parser.error("--profile profiles the FastStream front: give --front faststream too")
    return Plan(
        messages=messages,
        repeat=args.repeat or int(sizes["repeat"]),
        stores=args.stores or list(AGAINST_STORES if args.against else STORES),
        out=args.out,
        quick=args.quick,
        rss_messages=args.rss_messages or int(sizes["rss"]),
        latency_rate=LATENCY_RATE,
        latency_seconds=float(sizes["latency_seconds"]),
        dynamodb_server=args.dynamodb_server,
        fronts=tuple(dict.fromkeys(args.front)),
        profile=args.profile,
        against=tuple(dict.fromkeys(args.against)),
    )


def refuse_against(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What --against cannot measure yet, refused in one line."""
    # The other revision's SQL tables and DynamoDB items may differ from this
    # checkout's, which creates them; its Redis Cluster support may be missing.
    outside = sorted(set(args.stores or ()) - set(AGAINST_STORES))
    if outside:
        parser.error(f"--against measures the Redis store only, not {', '.join(outside)}")
    if args.front:
        parser.error("--against measures semel's worker only, not --front")


def main(argv: list[str] | None = None) -> int:
    plan = parse(sys.argv[1:] if argv is None else argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a CI log or a file: keep the table on one line per row
    try:
        results = asyncio.run(Runner(plan, console).measure())
    except BenchError as exc:
        console.print(f"[red]benchmark failed:[/] {exc}")
        return 1
    publish(results, plan.out, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
