"""The chaos run: effectively-once under worker kills, a broker restart and store faults.

Usage::

    python -m tests.chaos --store {sqlite,postgres,redis,dynamodb,postgres-tx,
                                   redis-cluster,redis-sentinel,all}[,...]
                          [--faults {classic,full,blackhole,slow,all}[,...]]
                          [--replicas-ack N[,N...]]
                          [--front {worker,faststream}]
                          [--messages N] [--workers W] [--kills K]
                          [--kill-every SECONDS] [--duplicates SHARE] [--seed S]
                          [--rate R] [--outage SECONDS] [--stall SECONDS]
                          [--delay MS] [--keep DIR]

For each store it starts a private RabbitMQ node and a private store server on
free loopback ports (the shared services are never touched), runs W
``python -m semel`` processes with the ledger handler
(``tests.chaos.ledger:handle``), and publishes N messages of which 40 % are
duplicates (``--duplicates``; half concurrent copies, half late copies sent
after the key completed). While they flow it SIGKILLs K workers in the middle
of a handler (each restarted at once; ``--kill-every S``: one every S seconds
until the producer is done, instead), restarts the broker (``rabbitmqctl stop_app`` /
``start_app``) and takes the store away for ``--outage`` seconds (longer than
the 2.5 s lease, on purpose): PostgreSQL and Redis servers are stopped and
started, DynamoDB's port is cut by a TCP proxy (moto keeps its tables in
memory), SQLite has no server and skips that fault. ``postgres-tx`` is the
PostgreSQL store in transactional mode (``SEMEL_TRANSACTIONAL``), whose
handler writes its effect in the key's own transaction. Then it waits until
every key is completed in the store or in ``Q.dlq`` and prints one table.
That is the ``classic`` run.

``--front faststream`` runs the workers as FastStream apps with semel's
middleware (``tests.chaos.faststream_app``) instead: the same ``SEMEL_*``
environment, a subscriber on the work queue that is the same ledger handler,
the same JSON ``settled`` lines, so every figure and the verdict read the
same. Its subscriber is the async handler only: ``postgres-tx`` and
``rolling`` runs are skipped with it.

``--faults`` (default ``all``) picks the runs made for each store; each kind
other than ``classic`` is a run of its own with ``--messages`` x 2/5
messages, the same duplicates, no broker restart and no outage, so what it
leaves is the fault's alone (see ``tests.chaos.faults``):

- ``full`` (Redis): at a quarter of the flow ``maxmemory`` is set just above
  ``used_memory`` with ``noeviction`` for ``--outage`` seconds: writes get
  ``OOM``, reads answer; then the old values come back.
- ``blackhole`` (PostgreSQL, Redis, DynamoDB, postgres-tx): worker 0 reaches
  the store through a TCP proxy of its own, the other workers directly; at a
  quarter of the flow, while worker 0 runs handlers, the proxy stops
  forwarding for ``--stall`` seconds (default 6, more than two leases) without
  closing anything: packets dropped, no reset. Then it forwards again.
- ``slow`` (the same stores): every worker reaches the store through a proxy
  that holds each chunk ``--delay`` ms (default 50) in each direction, for the
  whole run, with a prefetch of 256, the 2.5 s lease, and messages published
  at 4 x ``--rate`` so the prefetch windows fill up.
- ``rolling`` (every store but postgres-tx): the handler is a plain ``def``
  on a thread of its own, and ``--terms`` times (default 6) a worker is
  SIGTERMed mid-handler with a shutdown grace of 0.05 s and started again
  once it has exited, with ``--kills`` / 2 SIGKILLs mid-handler between.

SQLite has no server and no link to fault: only ``classic`` and ``rolling``
run for it. A kind that does not fit a store is skipped for it. The default
``--store all`` makes 18 runs: 5 classic, 1 full, 4 blackhole, 4 slow,
4 rolling.

``redis-cluster`` and ``redis-sentinel`` (not in ``all``: each adds a
6-server topology and about a minute) run the Redis store against a private
Redis Cluster (3 primaries, 3 replicas) or a primary, its replica and 3
sentinels (``tests.redis_servers``). Their classic run's store fault is a
failover instead of an outage: at 60 % of the flow a primary is SIGKILLed,
the run waits for its replica to be promoted, then starts the old primary
again as the new one's replica. Only ``classic`` fits them.
``--replicas-ack`` (default 0) sets ``SEMEL_REDIS_REPLICAS_ACK`` for them;
several values, comma-separated, make one run each.

Reading the table: *lost* counts keys neither completed in the store
(``get(key)``) nor in the private broker's ``Q.dlq``; *parked* counts keys
whose handler was meant to succeed, not completed, found only in ``Q.dlq``
(claimed too many times, say): not lost, but their work was never done. The ledger
(``tests.chaos.ledger``) records every execution and stamps its side effect;
a key with two stamped effects is a *duplicate effect*. One is *explained by
a kill* when its worker was SIGKILLed after the effect and never settled the
delivery; *lease expired in outage* (*in fault* in the faults table) when
its worker handed the delivery back because the store was unreachable (or
full) during the outage -- for a blackhole, only if it is the worker cut
off -- and the lease then ran out and a redelivery ran the handler again;
*unreplicated at failover* when the primary was killed within a second of
the execution's claim (its start) or of its delivery settling as completed,
and the key ran again after the kill: the write never reached the promoted
replica (``tests.chaos.verdict``); anything else is *unexplained*, and so is
any duplicate effect whose execution ran at the same time as another
execution of its key, whatever the fault, unless its claim was lost so.
*Overlaps* counts every such pair of executions, with an effect or not (a
handler blocked in a store call while another worker reran its key, say),
and apart those after a claim lost at a failover; it does not fail a run by
itself. The classic runs print one table, a column per store; the other
kinds a second table, a row per store and fault.

Exit status: 0 when every run ends with lost = 0, parked = 0 and no
unexplained duplicate effect (in transactional mode: no duplicate effect at
all; with ``--replicas-ack`` >= 1: none unreplicated either); 1 otherwise
(the evidence is printed under the tables); 2 on bad usage. ``--keep DIR``
keeps each store's ledger and worker logs (those of the other fault kinds
under ``DIR/<fault>/``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from rich.console import Console

from tests.chaos.faults import CLASSIC, FAULTS, REPLICATED_REDIS, ROLLING, fits
from tests.chaos.rabbit import LANE_ENV, RabbitNode
from tests.chaos.run import ChaosConfig, Report, front_fits, run_chaos
from tests.chaos.table import evidence, tables
from tests.chaos.transactional import TRANSACTIONAL
from tests.chaos.workers import FRONTS, WORKER

STORES = ("sqlite", "postgres", "redis", "dynamodb", TRANSACTIONAL)  # --store all
LEASE = ChaosConfig(store="sqlite").lock_ttl


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--store",
        type=_stores,
        required=True,
        help=f"comma-separated, of {', '.join((*STORES, *REPLICATED_REDIS))} or all",
    )
    parser.add_argument(
        "--replicas-ack",
        type=_acks,
        default=(0,),
        help="SEMEL_REDIS_REPLICAS_ACK of the redis-cluster and redis-sentinel runs; "
        "comma-separated: a run each (default 0)",
    )
    parser.add_argument("--messages", type=int, default=3000, help="messages in all (default 3000)")
    parser.add_argument("--workers", type=int, default=2, help="consumer processes (default 2)")
    parser.add_argument("--kills", type=int, default=12, help="SIGKILLs mid-handler (default 12)")
    parser.add_argument(
        "--kill-every",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="classic runs: a SIGKILL mid-handler every SECONDS from 10 %% of the flow "
        "until the producer is done, instead of --kills",
    )
    parser.add_argument(
        "--duplicates",
        type=float,
        default=ChaosConfig(store="sqlite").duplicates,
        metavar="SHARE",
        help="share of the messages that are copies, half concurrent, half late (default 0.4)",
    )
    parser.add_argument(
        "--front",
        choices=tuple(FRONTS),
        default=WORKER,
        help="worker: python -m semel (default); faststream: a FastStream app with "
        "semel's middleware",
    )
    parser.add_argument(
        "--terms",
        type=int,
        default=6,
        help="rolling runs: SIGTERMs mid-handler (default 6), with half --kills SIGKILLs",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=100.0, help="messages per second")
    parser.add_argument(
        "--faults",
        type=_faults,
        default=FAULTS,
        help=f"comma-separated, of {', '.join(FAULTS)} or all (default all)",
    )
    parser.add_argument(
        "--outage", type=float, default=6.0, help="seconds the store is away or full (default 6)"
    )
    parser.add_argument(
        "--stall", type=float, default=6.0, help="seconds a blackholed link stalls (default 6)"
    )
    parser.add_argument(
        "--delay", type=float, default=50.0, help="ms a slow link holds each chunk (default 50)"
    )
    parser.add_argument(
        "--rabbitmq",
        choices=("3", "4"),
        default=os.environ.get(LANE_ENV, "3"),
        help="3: the machine's RabbitMQ (default); 4: RabbitMQ 4.0 from a Debian 13 root",
    )
    parser.add_argument("--keep", type=Path, help="keep ledgers and worker logs here")
    args = parser.parse_args(argv)
    if args.workers < 2 or args.messages < 25 or args.kills < 0 or args.rate <= 0:
        parser.error("need --workers >= 2, --messages >= 25, --kills >= 0, --rate > 0")
    if not 0 <= args.duplicates < 1 or args.kill_every < 0:
        parser.error("need 0 <= --duplicates < 1, --kill-every >= 0")
    if args.stall <= 2 * LEASE or args.delay < 0:
        parser.error(f"need --stall > {2 * LEASE:g} (two leases), --delay >= 0")
    if not runs(args):
        stores = ",".join(args.store)
        parser.error(
            f"--faults {','.join(args.faults)} fits no store of --store {stores}"
            f" with --front {args.front}"
        )
    return args


def runs(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(store, fault, replicas_ack) of every run asked for, in order: a kind that does not
    fit (the store, or the front door) is skipped."""
    return [
        (store, fault, ack)
        for store in args.store
        for fault in args.faults
        if fits(fault, store) and front_fits(args.front, store, fault)
        for ack in (args.replicas_ack if store in REPLICATED_REDIS else (0,))
    ]


def _stores(text: str) -> tuple[str, ...]:
    chosen: list[str] = []
    for name in (name.strip() for name in text.split(",")):
        if name not in (*STORES, *REPLICATED_REDIS, "all"):
            raise argparse.ArgumentTypeError(f"unknown store {name!r}")
        chosen += [s for s in (STORES if name == "all" else (name,)) if s not in chosen]
    return tuple(chosen)


def _acks(text: str) -> tuple[int, ...]:
    try:
        acks = tuple(int(n) for n in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number list: {text!r}") from None
    if any(not 0 <= n <= 16 for n in acks):
        raise argparse.ArgumentTypeError("replica acknowledgements are 0 to 16")
    return acks


def _faults(text: str) -> tuple[str, ...]:
    chosen = {name.strip() for name in text.split(",")}
    if "all" in chosen:
        return FAULTS
    unknown = chosen - set(FAULTS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault kind {', '.join(sorted(unknown))}")
    return tuple(fault for fault in FAULTS if fault in chosen)


async def run_all(args: argparse.Namespace) -> list[Report]:
    node = await RabbitNode.start(lane=args.rabbitmq)
    reports = []
    try:
        for store, fault, replicas_ack in runs(args):
            classic = fault == CLASSIC
            keep = args.keep / fault if args.keep is not None and not classic else args.keep
            config = ChaosConfig(
                store=store,
                fault=fault,
                messages=args.messages if classic else args.messages * 2 // 5,
                workers=args.workers,
                kills=args.kills if classic else (args.kills // 2 if fault == ROLLING else 0),
                kill_every=args.kill_every if classic else 0.0,
                duplicates=args.duplicates,
                terms=args.terms,
                seed=args.seed,
                rate=args.rate,
                outage=args.outage,
                stall=args.stall,
                slow_delay=args.delay / 1000,
                drain_deadline=180 if classic else 120,
                keep=keep,
                replicas_ack=replicas_ack,
                front=args.front,
            )
            reports.append(await run_chaos(config, node))
    finally:
        node.stop()
    return reports


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    # SIGTERM unwinds like Ctrl-C, so every private server is stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # The producer's reconnects during the broker restart are expected, not news.
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0fms %(message)s")
    for name in ("aiormq", "aio_pika", "psycopg.pool", "botocore"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    reports = asyncio.run(run_all(args))
    # Wide enough for the stores side by side, and the faults table's columns,
    # when the output is a file or a pipe.
    console = Console(width=None if sys.stdout.isatty() else 160)
    for table in tables(reports):
        console.print(table)
    for line in (line for report in reports for line in evidence(report)):
        console.print(line, markup=False)
    return 0 if all(report.ok for report in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
