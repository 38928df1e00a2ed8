"""semel's store alone, without the broker: claim + complete pairs per second.

Beside the Powertools comparison it tells the server's limit from semel's:
if pairs/s do not grow from one request in flight to a prefetch window of
them, the server answers one request at a time and no client can go faster.
The CPU each side spends per pair says which one runs out first: this
process's (the client), and the DynamoDB server's when this run started it.

``python -m bench.store_only`` runs it alone on a local DynamoDB-compatible
server, with DynamoDB's data plane through semel's own client and through
botocore, to compare the client CPU each costs per pair.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import statistics
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import psutil

from bench.backends import DYNAMODB_SERVERS, Backends, open_store
from bench.broker import BenchError
from semel.consumer.container import store_options
from semel.settings import Settings
from semel.stores.base import Outcome, Store

FINGERPRINT = "bench"
WARM_UP = 20  # pairs before the timing starts: connection set-up is not measured


async def _pair(store: Store, key: str) -> None:
    claim = await store.claim(key, FINGERPRINT)
    if claim.outcome is not Outcome.CLAIMED:
        raise BenchError(f"store-only run: {key} was {claim.outcome.value}, not a new key")
    await store.complete(key, claim.fence, None)


@dataclass(frozen=True, slots=True)
class StoreRun:
    pairs_per_s: float
    client_us: float  # this process's CPU per pair
    server_us: float | None  # the server's CPU per pair, if it is a child of this run


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def server_process(url: str | None) -> psutil.Process | None:
    """The child of this run listening on ``url``'s port (the local DynamoDB server)."""
    port = urlsplit(url).port if url else None
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            for conn in child.net_connections("tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
                    return child
    return None


async def store_run(
    backends: Backends, kind: str, pairs: int, in_flight: int, data_plane: str = "lean"
) -> StoreRun:
    """Claim and complete ``pairs`` new keys, ``in_flight`` at a time; DynamoDB's data plane
    through ``data_plane``: semel's own (``lean``) or ``botocore``."""
    settings = backends.settings(kind, f"store-{in_flight}")
    await backends.migrate(settings)
    if kind == "dynamodb":
        store = await _open(settings, data_plane)
    else:
        store = await open_store(settings)
    window = asyncio.Semaphore(in_flight)

    async def pair(key: str) -> None:
        async with window:
            await _pair(store, key)

    server = server_process(backends.dynamodb_url) if kind == "dynamodb" else None
    client = psutil.Process()
    try:
        await asyncio.gather(*(pair(f"warm-{n}") for n in range(WARM_UP)))
        # Only the pairs are counted: opening the store (boto3's client, the
        # table) is paid once per process, not per message.
        before = _cpu(client), _cpu(server) if server else 0.0
        started = time.perf_counter()
        await asyncio.gather(*(pair(f"k-{n}") for n in range(pairs)))
        rate = pairs / (time.perf_counter() - started)
        client_us = (_cpu(client) - before[0]) / pairs * 1e6
        server_us = (_cpu(server) - before[1]) / pairs * 1e6 if server else None
    finally:
        await store.close()
    return StoreRun(rate, client_us, server_us)


async def _open(settings: Settings, data_plane: str) -> Store:
    """The DynamoDB store as the consumer opens it, its data plane through ``data_plane``."""
    options = store_options(settings)
    module = importlib.import_module(options.module)
    store: Store = await module.open_store(**options.kwargs, data_plane=data_plane)
    return store


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.store_only``: the store alone on a local server started for the run."""
    parser = argparse.ArgumentParser(prog="python -m bench.store_only", description=__doc__)
    parser.add_argument("--pairs", type=int, default=1000, help="claim + complete pairs per run")
    parser.add_argument("--in-flight", default="1,256", help="requests in flight, one run each")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, the median shown")
    parser.add_argument("--server", choices=sorted(DYNAMODB_SERVERS), default="moto")
    parser.add_argument(
        "--clients", default="botocore,lean", help="DynamoDB data planes, one run each"
    )
    args = parser.parse_args(argv)
    windows = [int(part) for part in args.in_flight.split(",")]
    clients = args.clients.split(",")
    with Backends(["dynamodb"], args.server) as backends:
        for in_flight in windows:
            runs: dict[str, list[StoreRun]] = {client: [] for client in clients}
            for _ in range(args.repeat):
                # Interleaved, so that the machine's drifts touch every client alike.
                for client in clients:
                    run = store_run(backends, "dynamodb", args.pairs, in_flight, client)
                    runs[client].append(asyncio.run(run))
            for client in clients:
                _print(client, in_flight, runs[client])


def _print(client: str, in_flight: int, runs: list[StoreRun]) -> None:
    rate = statistics.median(run.pairs_per_s for run in runs)
    cpu = statistics.median(run.client_us for run in runs)
    line = f"{client:>8}, {in_flight:>3} in flight: {rate:,.0f} pairs/s, client {cpu:,.0f} µs/pair"
    server = [run.server_us for run in runs if run.server_us is not None]
    if server:
        line += f", server {statistics.median(server):,.0f} µs/pair"
    print(line, flush=True)


if __name__ == "__main__":
    main()
