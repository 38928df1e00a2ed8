"""semel on a three-node RabbitMQ cluster: node faults under duplicate traffic, and a publisher.

Usage::

    python -m tests.cluster [--faults leader-kill,rolling,partition,storm,publish|all]
                            [--messages N] [--rate R] [--seed S] [--keep DIR]
                            [--queue-type quorum|classic|both] [--repeat N]

It starts a cluster of three RabbitMQ nodes on this machine, each in its own
network namespace (:mod:`tests.rabbit_cluster`; root needed), and a private
Redis store. Each fault is one run: fresh queues (their leader on node 1,
replicated on all three), two workers (three for the partition) given the
three nodes in ``SEMEL_AMQP_URL``, worker 0 on node 1 and another worker on
another node, N messages (default 2000) of which 40 % are duplicates,
published at R a second (default 100; 25 for ``rolling``, so that every
node's restart meets traffic) by a producer that sends each message
again until the cluster confirms it. The faults (:mod:`tests.cluster.faults`):

- ``leader-kill``: node 1, which holds the work queue's leader, is
  SIGKILLed at a quarter of the flow and started again 5 s later;
- ``rolling``: from 8 % of the flow, each node in turn, node 1 first, is
  stopped with ``rabbitmqctl stop_app`` for 5 s and started again, as a
  rolling upgrade does it, while the traffic flows;
- ``partition``: node 1's network link goes down (its peers and every client
  outside its namespace stop hearing from it, nothing is reset) until it has
  paused itself (``pause_minority``), the queue's leader has moved, and a
  worker connected to it from outside has given it up; then the link comes
  up. Worker 0 runs beside node 1, inside its namespace: the partition cuts
  it off from the other nodes and from the store;
- ``storm``: three workers, a conflict-heavy stream (most copies concurrent,
  several per key at once; default 70 a second), a worker SIGKILLed every 2 s,
  and the node leading the work queue SIGKILLed at a fifth and at a half of
  the flow, each time started again 8 s later (:mod:`tests.cluster.storm`).
  When the queues look drained, the management API must count no message
  held for dead-lettering in any of semel's queues;
- ``publish``: ``semel publish --count 3000 --rate 300`` against the cluster;
  the node its connection is on is SIGKILLed once 30 % are in the queue.

``--queue-type`` runs the node faults on quorum queues (the default), classic
ones, or both; ``--repeat N`` runs each N times in a row, seeds S, S+1, ...

Then it waits until every key is completed or dead-lettered and prints one
table. A ledger outside the store records every handler execution (the
chaos run's, :mod:`tests.chaos.ledger`): *lost* counts keys neither completed
nor in ``Q.dlq``; a key with two effects is a *duplicate effect*, and one is
explained only when its worker was cut off from the store by the partition,
could not store the completion, and its lease ran out (*lease expired while
cut off*). Anything else is *unexplained*.

Exit status: 0 when every run passes (lost 0, no unexplained duplicate
effect, no two executions of one key at once, no worker exited, and for the
publisher every message confirmed or reported failed, every confirmed one in
the queue); 1 otherwise; 2 on bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import signal
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from semel.settings import QueueType
from tests.cluster.faults import FAULTS
from tests.cluster.publish import PublishProof, publish_through_a_node_death
from tests.cluster.run import ClusterConfig, ClusterReport, run_cluster
from tests.cluster.storm import STORM
from tests.cluster.table import publish_table, runs_table, timelines, verdict_of
from tests.rabbit_cluster import RabbitCluster, missing

PUBLISH = "publish"
CHOICES = (*FAULTS, STORM, PUBLISH)
QUEUE_TYPES: dict[str, tuple[QueueType, ...]] = {
    "quorum": (QueueType.QUORUM,),
    "classic": (QueueType.CLASSIC,),
    "both": (QueueType.QUORUM, QueueType.CLASSIC),
}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--faults", type=_faults, default=CHOICES, help="comma-separated, or all")
    parser.add_argument("--messages", type=int, default=2000, help="messages per run (2000)")
    parser.add_argument(
        "--rate", type=float, help="messages per second (100; 25 rolling, 70 storm: to span them)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep ledgers and worker logs here")
    parser.add_argument("--queue-type", choices=sorted(QUEUE_TYPES), default="quorum")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each fault, in a row")
    args = parser.parse_args(argv)
    if args.messages < 100 or (args.rate is not None and args.rate <= 0) or args.repeat < 1:
        parser.error("need --messages >= 100, --rate > 0 and --repeat >= 1")
    return args


def _faults(text: str) -> tuple[str, ...]:
    chosen = {name.strip() for name in text.split(",")}
    if "all" in chosen:
        return CHOICES
    unknown = chosen - set(CHOICES)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown: {', '.join(sorted(unknown))}")
    return tuple(choice for choice in CHOICES if choice in chosen)


async def run_all(
    args: argparse.Namespace,
) -> tuple[float, list[ClusterReport], PublishProof | None]:
    cluster = await RabbitCluster.start()
    logging.getLogger("semel.cluster").info(
        "cluster up in %.1fs: %s", cluster.started_in, cluster.url
    )
    reports, proof = [], None
    try:
        for fault in args.faults:
            if fault == PUBLISH:
                with tempfile.TemporaryDirectory(prefix="semel-pub-") as workdir:
                    proof = await publish_through_a_node_death(cluster, Path(workdir))
                continue
            for queue_type in QUEUE_TYPES[args.queue_type]:
                for turn in range(args.repeat):
                    keep = None
                    if args.keep is not None:
                        keep = args.keep / f"{queue_type}-{turn + 1}"
                    config = ClusterConfig(
                        fault=fault, messages=args.messages, rate=args.rate,
                        seed=args.seed + turn, queue_type=queue_type, keep=keep,
                    )  # fmt: skip
                    report = await run_cluster(config, cluster)
                    logging.getLogger("semel.cluster").info(
                        "%s run %d (seed %d): %s", report.label, turn + 1, config.seed,
                        verdict_of(report),
                    )  # fmt: skip
                    if keep is not None:  # each run's figures beside its ledger and logs
                        keep.mkdir(parents=True, exist_ok=True)
                        (keep / "report.txt").write_text(rendered([report]))
                    reports.append(report)
    finally:
        cluster.stop()
    return cluster.started_in, reports, proof


def rendered(reports: list[ClusterReport]) -> str:
    """The runs' table and timelines, as text (a column per run)."""
    console = Console(width=max(160, 60 + 44 * len(reports)), record=True, file=io.StringIO())
    console.print(runs_table(reports))
    for line in timelines(reports):
        console.print(line, markup=False)
    return console.export_text()


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    why = missing()
    if why is not None:
        print(f"python -m tests.cluster: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # unwinds: the cluster is removed
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0fms %(message)s")
    for name in ("aiormq", "aio_pika"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    began = time.monotonic()
    started_in, reports, proof = asyncio.run(run_all(args))
    # A column per run: wide enough for ten of them when the output is a file.
    console = Console(width=None if sys.stdout.isatty() else max(160, 60 + 44 * len(reports)))
    console.print(
        f"cluster start-up: {started_in:.1f} s; everything: {time.monotonic() - began:.0f} s"
    )
    if reports:
        console.print(rendered(reports), markup=False)
    if proof is not None:
        console.print(publish_table(proof))
    ok = all(report.ok for report in reports) and (proof is None or proof.ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
