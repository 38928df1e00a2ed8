"""One benchmark run: every case, repeated, in one process against the local servers.

Cases of a repeat run one after the other, baseline first, so slow drifts of
the machine spread over all of them; each figure is the median of the repeats.
"""

from __future__ import annotations

import asyncio
import os
import platform
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson
import psutil
from rich.console import Console

from bench.backends import PREFETCH, Backends
from bench.broker import BenchError, Broker
from bench.cases import BASELINE, FASTSTREAM, WORKER, Cases, Drains, Rate
from bench.children import ROOT
from bench.report import (
    FASTSTREAM_BARE,
    FASTSTREAM_SEMEL,
    FASTSTREAM_TARGETS,
    RATIO_TARGETS,
    CaseResult,
    Results,
)
from bench.revision import Revision, dependency_differences, prepare, this_checkout
from bench.store_only import store_run

# The local DynamoDB-compatible servers answer tens to hundreds of requests a
# second (moto one at a time): DynamoDB cases drain fewer messages, and their
# latency is taken at a rate those servers can follow.
DYNAMODB_MESSAGES = {"full": 2_000, "quick": 100}
DYNAMODB_LATENCY_RATE = 10.0
TWO_PROCESS_STORE = "redis"  # the store of the two-consumer case, when it is measured


@dataclass(frozen=True)
class Plan:
    """What one run measures, and how much."""

    messages: int
    repeat: int
    stores: list[str]
    out: Path
    quick: bool
    rss_messages: int
    latency_rate: float
    latency_seconds: float
    dynamodb_server: str = "moto"
    fronts: tuple[str, ...] = ()  # besides the worker: "faststream"
    profile: Path | None = None  # the FastStream front's cProfile statistics, one file a drain
    against: tuple[str, ...] = ()  # other revisions (git refs) measured beside this checkout

    def messages_for(self, kind: str) -> int:
        if kind == "dynamodb":
            return min(self.messages, DYNAMODB_MESSAGES["quick" if self.quick else "full"])
        return self.messages

    def rss_messages_for(self, kind: str) -> int:
        if kind == "dynamodb":
            return min(self.rss_messages, self.messages_for(kind))
        return self.rss_messages

    def latency_rate_for(self, kind: str) -> float:
        return DYNAMODB_LATENCY_RATE if kind == "dynamodb" else self.latency_rate

    @property
    def two_process_store(self) -> str:
        return TWO_PROCESS_STORE if TWO_PROCESS_STORE in self.stores else self.stores[0]


class Runner:
    def __init__(self, plan: Plan, console: Console) -> None:
        self.plan = plan
        self.console = console
        # (front, kind, keys, processes) -> one Rate per repeat
        self.rates: dict[tuple[str, str, str, int], list[Rate]] = defaultdict(list)
        self.powertools: dict[str, list[float]] = defaultdict(list)
        self.run_id = ""
        self.others: list[Revision] = []  # with --against
        self.checkout: dict[str, object] = {}  # this side of the comparison: HEAD and changes
        # (sha, kind, keys) -> another revision's Rate per repeat
        self.other_rates: dict[tuple[str, str, str], list[Rate]] = defaultdict(list)

    def note(self, text: str) -> None:
        self.console.log(text)

    async def repeat(self, cases: Cases, backends: Backends, index: int) -> None:
        plan = self.plan
        # Each kind's fronts back to back, so that the ratios between them (the
        # middleware over bare FastStream and over the worker) divide neighbouring drains.
        for kind in [BASELINE, *plan.stores]:
            for front in (WORKER, *plan.fronts):
                drains = await cases.throughput(kind, plan.messages_for(kind), front=front)
                self.keep(index, front, kind, drains)
        store = plan.two_process_store
        drains = await cases.throughput(store, plan.messages_for(store), processes=2)
        self.rates[(WORKER, store, "unique", 2)].append(drains.unique)
        rate = drains.unique.per_second
        self.note(f"[{index + 1}/{plan.repeat}] {store} x2: {rate:,.0f} msg/s")
        if backends.dynamodb_url is not None:
            await self.dynamodb_comparison(backends, index)

    async def repeat_against(self, cases: Cases, index: int) -> None:
        """The baseline, then on each store this checkout and the other revisions; every
        other repeat in the reverse order, so that a drift of the machine weighs on all
        revisions alike over a pair of repeats."""
        plan = self.plan
        order: list[tuple[str, Revision | None]] = [(BASELINE, None)]
        order += [(kind, rev) for kind in plan.stores for rev in (None, *self.others)]
        for kind, revision in order[:: -1 if index % 2 else 1]:
            messages = plan.messages_for(kind)
            if revision is None:
                self.keep(index, WORKER, kind, await cases.throughput(kind, messages))
                continue
            drains = await cases.throughput_of(revision, kind, messages)
            assert drains.duplicates is not None
            self.other_rates[(revision.sha, kind, "unique")].append(drains.unique)
            self.other_rates[(revision.sha, kind, "duplicates")].append(drains.duplicates)
            self.note(
                f"[{index + 1}/{plan.repeat}] {kind} @{revision.label}: "
                f"{drains.unique.per_second:,.0f} msg/s, "
                f"duplicates {drains.duplicates.per_second:,.0f} msg/s"
            )

    def keep(self, index: int, front: str, kind: str, drains: Drains) -> None:
        self.rates[(front, kind, "unique", 1)].append(drains.unique)
        name = kind if front == WORKER else f"{front} {kind}"
        line = f"[{index + 1}/{self.plan.repeat}] {name}: {drains.unique.per_second:,.0f} msg/s"
        if drains.duplicates is not None:
            self.rates[(front, kind, "duplicates", 1)].append(drains.duplicates)
            line += f", duplicates {drains.duplicates.per_second:,.0f} msg/s"
        self.note(line)

    async def dynamodb_comparison(self, backends: Backends, index: int) -> None:
        """Powertools' calls/s, and semel's store alone at 1 and a full window in flight."""
        calls = self.plan.messages_for("dynamodb")
        rate = await powertools_rate(backends, calls, f"r{index}")
        self.powertools["powertools_rates"].append(rate)
        line = f"[{index + 1}/{self.plan.repeat}] powertools: {rate:,.0f} calls/s"
        for in_flight in (1, PREFETCH):
            run = await store_run(backends, "dynamodb", calls, in_flight)
            self.powertools[f"store_rates_{in_flight}"].append(run.pairs_per_s)
            self.powertools[f"store_client_us_{in_flight}"].append(run.client_us)
            line += f", semel store {in_flight} in flight: {run.pairs_per_s:,.0f} pairs/s"
            line += f" (CPU per pair: client {run.client_us:,.0f} µs"
            if run.server_us is not None:
                self.powertools[f"store_server_us_{in_flight}"].append(run.server_us)
                line += f", server {run.server_us:,.0f} µs"
            line += ")"
        self.note(line)

    async def measure(self) -> Results:
        plan = self.plan
        started = time.monotonic()
        for ref in plan.against:
            revision = await asyncio.to_thread(prepare, ref, None, self.note)
            if revision.sha not in {other.sha for other in self.others}:
                self.others.append(revision)
        self.checkout = this_checkout()  # what this side runs, as the run starts
        with Backends(plan.stores, plan.dynamodb_server) as backends:
            self.run_id = backends.run_id
            broker = await Broker.open()
            try:
                cases = Cases(broker, backends, plan.out / "logs", plan.profile)
                for index in range(plan.repeat):
                    if self.others:
                        await self.repeat_against(cases, index)
                    else:
                        await self.repeat(cases, backends, index)
                long_runs = {}
                # A comparison of revisions is about throughput: no long runs.
                kinds = [] if self.others else [BASELINE, *plan.stores]
                for kind in kinds:
                    rate = plan.latency_rate_for(kind)
                    run = await cases.long_run(
                        kind, plan.rss_messages_for(kind), rate, plan.latency_seconds
                    )
                    long_runs[kind] = asdict(run) | {"latency_rate": rate}
                    figures = (run.rss_first_mb, run.rss_second_mb, run.rss_third_mb)
                    rss = " → ".join(f"{mb:.0f}" for mb in figures) + " MB"
                    self.note(f"long run {kind}: RSS {rss}")
            finally:
                await broker.close()
        results = Results(
            meta=self.meta(time.monotonic() - started),
            cases=self.case_results(),
            long_runs=long_runs,
            powertools=dict(self.powertools) if self.powertools else None,
        )
        results.finish()
        return results

    def case_results(self) -> list[CaseResult]:
        results = []
        for (front, kind, keys, processes), drains in self.rates.items():
            target = None
            if front == FASTSTREAM and kind == BASELINE:
                name, consumer, store = "faststream (bare)", FASTSTREAM_BARE, None
            elif front == FASTSTREAM:
                name, consumer, store = f"faststream+semel-{kind}-{keys}", FASTSTREAM_SEMEL, kind
            elif kind == BASELINE:
                name, consumer, store = "baseline (bare aio-pika)", BASELINE, None
            else:
                name, consumer, store = f"semel-{kind}-{keys}", "semel", kind
                if processes > 1:
                    name = f"semel-{kind}-{keys}-{processes}procs"
                target = RATIO_TARGETS.get((kind, keys)) if processes == 1 else None
            messages = self.plan.messages_for(kind)
            rates = [drain.per_second for drain in drains]
            cpu = [drain.cpu_us for drain in drains]
            case = CaseResult(name, consumer, store, keys, processes, messages, rates, cpu, target)
            if consumer == FASTSTREAM_SEMEL:
                case.faststream_target = FASTSTREAM_TARGETS.get((kind, keys))
            results.append(case)
        for other in self.others:
            results += self.other_results(other)
        return results

    def other_results(self, other: Revision) -> list[CaseResult]:
        return [
            CaseResult(
                f"semel-{kind}-{keys} @{other.label}",
                "semel",
                kind,
                keys,
                1,
                self.plan.messages_for(kind),
                [drain.per_second for drain in drains],
                [drain.cpu_us for drain in drains],
                RATIO_TARGETS.get((kind, keys)),
                revision=other.sha,
            )
            for (sha, kind, keys), drains in self.other_rates.items()
            if sha == other.sha
        ]

    def meta(self, seconds: float) -> dict[str, object]:
        plan = self.plan
        return {
            "run_id": self.run_id,  # in every queue, exchange and key name of the run
            "messages": plan.messages,
            "repeat": plan.repeat,
            "quick": plan.quick,
            "stores": plan.stores,
            "prefetch": PREFETCH,
            "fronts": [WORKER, *plan.fronts],
            "concurrency": concurrency(plan.fronts),
            "queue_type": "quorum",
            "rss_messages": plan.rss_messages,
            "latency_rate": plan.latency_rate,
            "latency_seconds": plan.latency_seconds,
            "dynamodb_server": plan.dynamodb_server if "dynamodb" in plan.stores else None,
            "cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "seconds": round(seconds, 1),
            "against": against(self.others, self.checkout) if self.others else None,
        }


def against(others: list[Revision], checkout: dict[str, object]) -> dict[str, object]:
    """The revisions of a comparison, and how their drains were ordered."""
    return {
        "checkout": checkout,
        "revisions": [
            {
                "ref": other.ref,
                "sha": other.sha,
                "consumer": f"python -m {other.module}",
                "dependencies_differing": dependency_differences(other),
            }
            for other in others
        ],
        "order": "baseline, then on each store this checkout and each other revision; "
        "reversed every other repeat",
    }


def concurrency(fronts: tuple[str, ...]) -> dict[str, str]:
    """How many deliveries each consumer runs at once, as the table's footnote says."""
    said = {
        "baseline (bare aio-pika)": f"QoS prefetch {PREFETCH}: aiormq runs each delivery's "
        f"callback in a task of its own, up to {PREFETCH} at once",
        "semel": f"SEMEL_PREFETCH={PREFETCH}: up to {PREFETCH} deliveries in the pipeline at "
        "once, their claims and completions batched to the store",
    }
    if FASTSTREAM in fronts:
        said["faststream"] = (
            f"Channel(prefetch_count={PREFETCH}); FastStream 0.7's RabbitMQ subscriber has no "
            f"max_workers: aiormq runs each delivery in a task of its own, up to {PREFETCH} "
            "at once (no prefetch_count would mean no limit); the middleware's claims and "
            "completions are batched to the store like the worker's"
        )
    return said


async def powertools_rate(backends: Backends, calls: int, tag: str) -> float:
    """Calls/s of Powertools' idempotent function, in a child process."""
    assert backends.dynamodb_url is not None
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.powertools",
        backends.dynamodb_url,
        f"powertools_{backends.run_id}",
        f"{backends.run_id}-{tag}",
        str(calls),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    stdout, stderr = await process.communicate()
    if process.returncode != 0:
        raise BenchError(f"powertools run failed: {stderr.decode()[-2000:]}")
    result = orjson.loads(stdout)
    return float(result["calls"]) / float(result["seconds"])
