"""The outbox chaos run: web requests staging messages while processes and servers fail.

Usage::

    python -m tests.outbox_chaos [--orders N] [--rate R] [--fail SHARE] [--repeat SHARE]
                                 [--web W] [--relays M] [--relays-in-web K]
                                 [--kill-every SECONDS] [--consumer-kills C]
                                 [--broker-down SECONDS] [--pg-down SECONDS]
                                 [--no-listen] [--seed S[,S...]] [--keep DIR]

On a private RabbitMQ node, a private PostgreSQL cluster and a private Redis
(the shared services are never touched) it runs W uvicorn processes of
``examples/fastapi_outbox.py`` (K of them with ``engine.relay()`` inside), M
``semel relay`` processes and a downstream ``python -m semel`` worker (Redis
store, the chaos ledger handler). A load driver posts N orders at R per
second, each with its own ``Idempotency-Key``: a ``--fail`` share with
``"fail": true`` (the endpoint raises after staging: the transaction rolls
back), a ``--repeat`` share sent again once answered; any request whose
answer is lost is sent again with the same key and body to another web
process. Meanwhile a web process or a relay (in turn) is SIGKILLed every
``--kill-every`` seconds and restarted, the broker is restarted at 30 % of
the flow and PostgreSQL stopped with ``-m immediate`` and started at 60 %;
the consumer is SIGKILLed ``--consumer-kills`` times past its effect.

After a drain (nothing unsent, every committed order completed downstream)
it prints one table, a column per seed (see ``tests.outbox_chaos.verdict``
for each figure). Exit status 0 when every run passes: nothing lost, no
wrong message id, no rolled-back order published, nothing staged without its
order, nothing unsent, every committed order consumed, no unexplained
duplicate effect downstream; 1 otherwise (the keys are printed under the
table); 2 on bad usage.
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
from tests.outbox_chaos.run import OutboxChaosConfig, Report, run_outbox_chaos
from tests.outbox_chaos.table import evidence, render

DEFAULTS = OutboxChaosConfig()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.outbox_chaos", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    add("--orders", type=int, default=DEFAULTS.orders, help="orders (keys) in all")
    add("--rate", type=float, default=DEFAULTS.rate, help="orders per second")
    add("--fail", type=float, default=DEFAULTS.fail, help="share sent with fail: true")
    add("--repeat", type=float, default=DEFAULTS.repeat, help="share sent again once answered")
    add("--web", type=int, default=DEFAULTS.web, help="uvicorn processes of the example")
    add("--relays", type=int, default=DEFAULTS.relays, help="semel relay processes")
    add("--relays-in-web", type=int, default=DEFAULTS.relays_in_web,
        help="web processes running engine.relay() inside")  # fmt: skip
    add("--kill-every", type=float, default=DEFAULTS.kill_every, metavar="SECONDS",
        help="a SIGKILL of a web process or a relay, in turn, every SECONDS (0: none)")  # fmt: skip
    add("--consumer-kills", type=int, default=DEFAULTS.consumer_kills,
        help="SIGKILLs of the downstream consumer past its effect")  # fmt: skip
    add("--broker-down", type=float, default=DEFAULTS.broker_down, help="seconds")
    add("--pg-down", type=float, default=DEFAULTS.pg_down, help="seconds")
    add("--no-listen", action="store_true", help="SEMEL_OUTBOX_LISTEN=false: the sweep only")
    add("--seed", type=_seeds, default=(DEFAULTS.seed,), help="comma-separated: a run each")
    add("--keep", type=Path, help="keep each run's ledger and process logs here")
    args = parser.parse_args(argv)
    if args.orders < 10 or args.rate <= 0 or args.web < 1 or args.relays < 0:
        parser.error("need --orders >= 10, --rate > 0, --web >= 1, --relays >= 0")
    if args.relays + args.relays_in_web < 1 or not 0 <= args.relays_in_web <= args.web:
        parser.error("need a relay somewhere, and --relays-in-web <= --web")
    if not (0 <= args.fail < 1 and 0 <= args.repeat <= 1):
        parser.error("need 0 <= --fail < 1 and 0 <= --repeat <= 1")
    return args


def _seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(seed) for seed in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of seeds: {text!r}") from None


async def run_all(args: argparse.Namespace) -> list[Report]:
    node = await RabbitNode.start()
    reports = []
    try:
        for seed in args.seed:
            config = OutboxChaosConfig(
                orders=args.orders,
                rate=args.rate,
                fail=args.fail,
                repeat=args.repeat,
                web=args.web,
                relays=args.relays,
                relays_in_web=args.relays_in_web,
                kill_every=args.kill_every,
                consumer_kills=args.consumer_kills,
                broker_down=args.broker_down,
                pg_down=args.pg_down,
                listen=not args.no_listen,
                seed=seed,
                keep=args.keep,
            )
            reports.append(await run_outbox_chaos(config, node))
    finally:
        node.stop()
    return reports


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    # SIGTERM unwinds like Ctrl-C, so every private server is stopped on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0fms %(message)s")
    for name in ("aiormq", "aio_pika", "psycopg.pool", "httpx"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    reports = asyncio.run(run_all(args))
    console = Console(width=None if sys.stdout.isatty() else 140)
    console.print(render(reports))
    for line in (line for report in reports for line in evidence(report)):
        console.print(line, markup=False)
    return 0 if all(report.ok for report in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
