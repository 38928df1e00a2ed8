"""The chaos run: effectively-once under worker kills, a broker restart and a store outage.

Usage::

    python -m tests.chaos --store {sqlite,postgres,redis,dynamodb,postgres-tx,all}
                          [--messages N] [--workers W] [--kills K] [--seed S]
                          [--rate R] [--outage SECONDS] [--keep DIR]

For each store it starts a private RabbitMQ node and a private store server on
free loopback ports (the shared services are never touched), runs W
``python -m consumer`` processes with the ledger handler
(``tests.chaos.ledger:handle``), and publishes N messages of which 40 % are
duplicates (half concurrent copies, half late copies sent after the key
completed). While they flow it SIGKILLs K workers in the middle of a handler
(each restarted at once), restarts the broker (``rabbitmqctl stop_app`` /
``start_app``) and takes the store away for ``--outage`` seconds (longer than
the 2.5 s lease, on purpose): PostgreSQL and Redis servers are stopped and
started, DynamoDB's port is cut by a TCP proxy (moto keeps its tables in
memory), SQLite has no server and skips that fault. ``postgres-tx`` is the
PostgreSQL store in transactional mode (``SEMEL_TRANSACTIONAL``), whose
handler writes its effect in the key's own transaction. Then it waits until
every key is completed in the store or in ``Q.dlq`` and prints one table.

Reading the table: *lost* counts keys neither completed in the store
(``get(key)``) nor in the private broker's ``Q.dlq``. The ledger
(``tests.chaos.ledger``) records every execution and stamps its side effect;
a key with two stamped effects is a *duplicate effect*. One is *explained by
a kill* when its worker was SIGKILLed after the effect and never settled the
delivery; *lease expired in outage* when its worker handed the delivery back
because the store was unreachable during the outage (the lease then ran out
and a redelivery ran the handler again); anything else is *unexplained*.

Exit status: 0 when every store ends with lost = 0 and no unexplained
duplicate effect (in transactional mode: no duplicate effect at all); 1
otherwise (the evidence is printed under the table); 2 on bad usage.
``--keep DIR`` keeps each store's ledger and worker logs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from rich.console import Console

from tests.chaos.rabbit import RabbitNode
from tests.chaos.run import ChaosConfig, Report, run_chaos
from tests.chaos.table import evidence, render
from tests.chaos.transactional import TRANSACTIONAL

STORES = ("sqlite", "postgres", "redis", "dynamodb", TRANSACTIONAL)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--store", choices=(*STORES, "all"), required=True)
    parser.add_argument("--messages", type=int, default=3000, help="messages in all (default 3000)")
    parser.add_argument("--workers", type=int, default=2, help="consumer processes (default 2)")
    parser.add_argument("--kills", type=int, default=12, help="SIGKILLs mid-handler (default 12)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=100.0, help="messages per second")
    parser.add_argument("--outage", type=float, default=6.0, help="seconds the store is away")
    parser.add_argument("--keep", type=Path, help="keep ledgers and worker logs here")
    args = parser.parse_args(argv)
    if args.workers < 2 or args.messages < 10 or args.kills < 0 or args.rate <= 0:
        parser.error("need --workers >= 2, --messages >= 10, --kills >= 0, --rate > 0")
    return args


async def run_all(args: argparse.Namespace) -> list[Report]:
    stores = STORES if args.store == "all" else (args.store,)
    node = await RabbitNode.start()
    reports = []
    try:
        for store in stores:
            config = ChaosConfig(
                store=store,
                messages=args.messages,
                workers=args.workers,
                kills=args.kills,
                seed=args.seed,
                rate=args.rate,
                outage=args.outage,
                keep=args.keep,
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
    # Wide enough for four stores side by side when the output is a file or a pipe.
    console = Console(width=None if sys.stdout.isatty() else 150)
    console.print(render(reports))
    for line in (line for report in reports for line in evidence(report)):
        console.print(line, markup=False)
    return 0 if all(report.ok for report in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
