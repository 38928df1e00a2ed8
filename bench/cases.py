"""The measurements: drain throughput, and a long run for memory and latency.

A consumer kind is ``"baseline"`` (the bare aio-pika consumer) or a store
name (semel with that store). The front says what consumes: ``"worker"``
(the aio-pika baseline, semel's worker) or ``"faststream"`` (a FastStream
app: bare for the baseline kind, with semel's middleware on the store
otherwise). Every case declares its own topology, runs its consumers as child
processes and removes its queues and exchanges after.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from bench import sweep
from bench.backends import Backends
from bench.broker import Batch, BenchError, Broker
from bench.children import Child, Group, start_baseline, start_faststream, start_semel
from bench.probes import percentiles, read_probes, settled_durations
from bench.revision import Revision
from semel.settings import LogLevel, Settings

BASELINE = "baseline"
WORKER = "worker"  # semel's own worker, or the bare aio-pika consumer
FASTSTREAM = "faststream"  # a FastStream subscriber, bare or with semel's middleware
FRONTS = (FASTSTREAM,)  # the fronts measured on request, beside the worker
LATENCY_TAG = "lat"


@dataclass(frozen=True, slots=True)
class Rate:
    """Messages/s of a drain, and the consumers' CPU time per message in µs."""

    per_second: float
    cpu_us: float


@dataclass(frozen=True, slots=True)
class Drains:
    """One case: unique keys, then (semel, one process) the same keys again."""

    unique: Rate
    duplicates: Rate | None


@dataclass(frozen=True, slots=True)
class Latency:
    """p50 and p99 in ms, and the sample count, of one figure."""

    p50_ms: float
    p99_ms: float
    samples: int

    @classmethod
    def of(cls, samples: list[float]) -> Latency | None:
        cuts = percentiles(samples)
        return None if cuts is None else cls(cuts[0], cuts[1], len(samples))


@dataclass(frozen=True, slots=True)
class LongRun:
    """One consumer process after three equal batches, then a light paced load.

    The first batch fills the worker's cache of completed keys (as many as
    ``SEMEL_COMPLETED_CACHE_SIZE``, 100,000 by default); the second turns it
    over, which rebuilds the dict under it once, larger (CPython sizes a table
    rebuilt after deletions from three times its live entries: about +6 MB at
    100,000 keys). From then on a batch replaces as much as it adds, so
    flatness is read from the second batch to the third.
    """

    messages_per_batch: int
    rss_first_mb: float
    rss_second_mb: float
    rss_third_mb: float
    publish_to_handler: Latency | None
    delivery_to_ack: Latency | None

    @property
    def growth(self) -> float:
        return self.rss_third_mb / self.rss_second_mb - 1


class Cases:
    """Runs cases against one broker connection and one run's backends."""

    def __init__(
        self, broker: Broker, backends: Backends, logs: Path, profile: Path | None = None
    ) -> None:
        self._broker = broker
        self._backends = backends
        self._logs = logs
        self._profile = profile  # the FastStream front's cProfile statistics go there

    @contextlib.asynccontextmanager
    async def _topology(self, kind: str, case: str) -> AsyncIterator[Settings]:
        store = "sqlite" if kind == BASELINE else kind  # the baseline never opens a store
        settings = self._backends.settings(store, case)
        await self._broker.declare(settings)
        try:
            if kind != BASELINE:
                await self._backends.migrate(settings)
            yield settings
        finally:
            await self._broker.delete(settings)

    def _start(
        self,
        kind: str,
        name: str,
        settings: Settings,
        probes: Path | None = None,
        front: str = WORKER,
    ) -> Child:
        if front == FASTSTREAM:
            return start_faststream(
                name, settings, self._logs, middleware=kind != BASELINE, profile=self._profile
            )
        if kind == BASELINE:
            return start_baseline(name, settings, self._logs, probes)
        return start_semel(name, settings, self._logs, probes)

    async def throughput(
        self, kind: str, messages: int, processes: int = 1, front: str = WORKER
    ) -> Drains:
        """Drain ``messages`` unique keys; for semel, drain the same keys again."""
        case = f"{kind}-x{processes}" if front == WORKER else f"{front}-{kind}"
        async with self._topology(kind, case) as settings:
            batch = Batch("k", messages)
            await self._broker.publish(settings.exchange, batch)
            unique = await self._drain(kind, settings, batch, processes, front, "unique")
            if kind == BASELINE or processes > 1:
                return Drains(unique, None)
            # Every key is completed now: the second drain is duplicates only.
            await self._broker.publish(settings.exchange, batch)
            again = await self._drain(kind, settings, batch, processes, front, "duplicates")
            return Drains(unique, again)

    async def _drain(
        self, kind: str, settings: Settings, batch: Batch, processes: int, front: str, keys: str
    ) -> Rate:
        def start(name: str) -> Child:
            return self._start(kind, name, settings, front=front)

        return await self._timed(settings, batch, keys, start, processes)

    async def _timed(
        self,
        settings: Settings,
        batch: Batch,
        keys: str,
        start: Callable[[str], Child],
        processes: int = 1,
        others: Revision | None = None,
    ) -> Rate:
        # Started only now, on a full queue: process start-up and topology are not timed.
        group = Group([start(f"{settings.queue}.{keys}.{n}") for n in range(processes)])
        try:
            drain = await self._broker.time_drain(settings.queue, batch.count, group)
        finally:
            codes = group.stop()
        await self._check_clean(settings, group.children, codes, others)
        for child in group.children:
            child.discard_log()
        return Rate(batch.count / drain.seconds, drain.cpu_seconds / batch.count * 1e6)

    async def throughput_of(self, revision: Revision, kind: str, messages: int) -> Drains:
        """:meth:`throughput` with another revision's consumer, one process. That
        consumer declares its own topology (its queue arguments may differ from this
        checkout's): it is started once on the empty queues, and stopped once it
        consumes, before the messages are published."""
        settings = self._backends.settings(kind, f"{kind}-{revision.label}")

        def start(name: str) -> Child:
            return revision.start(name, settings, self._logs)

        try:
            await self._declare_with(settings, start(f"{settings.queue}.declare"), revision)
            batch = Batch("k", messages)
            drains = []
            for keys in ("unique", "duplicates"):  # the second: every key completed already
                await self._broker.publish(settings.exchange, batch)
                drains.append(await self._timed(settings, batch, keys, start, others=revision))
            return Drains(drains[0], drains[1])
        finally:
            await sweep.remove(settings.queue)

    async def _declare_with(self, settings: Settings, child: Child, revision: Revision) -> None:
        group = Group([child])
        try:
            await sweep.consuming(settings.queue, child.alive)
        except BenchError as exc:
            raise BenchError(f"{exc}; see {child.log}") from None
        finally:
            codes = group.stop()
        await self._check_clean(settings, [child], codes, revision)
        child.discard_log()

    async def _check_clean(
        self,
        settings: Settings,
        children: list[Child],
        codes: list[int],
        others: Revision | None = None,
    ) -> None:
        """Every consumer exited cleanly and no message is left in any queue."""
        if others is None:
            left = await self._broker.leftovers(settings)
        else:  # another revision's topology: its queues found by name
            left = await sweep.leftovers(settings.queue)
        if left or any(codes):
            logs = ", ".join(str(child.log) for child in children)
            raise BenchError(f"{settings.queue}: exit codes {codes}, left {left}; see {logs}")

    async def long_run(self, kind: str, messages: int, rate: float, seconds: float) -> LongRun:
        """RSS after each of three batches; then latency at ``rate`` msg/s."""
        async with self._topology(kind, "long") as settings:
            # Delivery-to-ACK comes from semel's own settled lines, logged at debug.
            settings = settings.model_copy(update={"log_level": LogLevel.DEBUG})
            probes = self._logs / f"{settings.queue}.probes"
            probes.unlink(missing_ok=True)
            child = self._start(kind, settings.queue, settings, probes)
            group = Group([child])
            try:
                rss: list[float] = []
                for tag in ("first", "second", "third"):
                    batch = Batch(tag, messages)
                    await self._broker.publish(settings.exchange, batch)
                    await self._settle(settings, batch, group)
                    rss.append(child.rss() / 2**20)
                batch = Batch(LATENCY_TAG, max(int(rate * seconds), 20))
                await self._broker.publish_paced(settings.exchange, batch, rate)
                await self._settle(settings, batch, group)
            finally:
                codes = group.stop()
            await self._check_clean(settings, [child], codes)
            to_handler, to_ack = read_probes(probes)
            if kind != BASELINE:
                to_ack = settled_durations(child.log, f"{LATENCY_TAG}-")
            probes.unlink(missing_ok=True)
            child.discard_log()
        first, second, third = rss
        return LongRun(messages, first, second, third, Latency.of(to_handler), Latency.of(to_ack))

    async def _settle(self, settings: Settings, batch: Batch, group: Group) -> None:
        """Wait until ``batch`` is consumed (the consumer was already running: not timed)."""
        await self._broker.time_drain(settings.queue, batch.count, group, strict=False)
