"""The worker: consumes the work queue and runs one pipeline task per delivery.

Up to ``SEMEL_PREFETCH`` deliveries are processed at once (the broker sends
no more than that unacknowledged). A stop request (SIGTERM / SIGINT) detaches
the consumer, lets the handlers in flight finish for ``shutdown_grace``
seconds, then cuts the rest short: their claims are released and their
messages handed back, so another worker picks them up at once. A plain
handler's thread cannot be cut short: it gets a few seconds more to end, and
the key of one still running stays held until the process exits (see
:mod:`semel.consumer.delivery.thread_watch`). A stop because a store ping found the
store not set up for semel goes the same way, then raises.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import structlog
from aio_pika.abc import AbstractRobustChannel, AbstractRobustConnection

from semel.consumer.broker.connection import through_drops
from semel.consumer.broker.intake import Intake
from semel.consumer.broker.settle import Settler
from semel.consumer.delivery.decide import NackToConflict, Outcome, Requeue
from semel.consumer.delivery.message import Incoming
from semel.consumer.delivery.observe import Observer
from semel.consumer.delivery.pipeline import THREAD_STOP_WAIT, Pipeline, PipelineConfig
from semel.consumer.delivery.routes import Routes
from semel.consumer.delivery.thread_watch import THREAD_LEASES
from semel.consumer.names import BROKER_CALL_TIMEOUT, Topology
from semel.consumer.runtime.supervise import StoreGate, broker_gone_for
from semel.stores.base import Store
from semel.stores.errors import EXIT_FAILURE, StoreMisconfigured, StoreUnavailable

EXIT_OK = 0
# Seconds cut-short tasks get to release their claims; a plain handler's
# thread first gets THREAD_STOP_WAIT of them to end.
_CUT_SHORT_WAIT = THREAD_STOP_WAIT + 5.0


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """The values the worker loop runs with."""

    queue: str
    prefetch: int = 256
    shutdown_grace: float = 30.0
    broker_give_up: float = 300.0
    purge_interval: float = 300.0  # transactional mode: seconds between background purges


log = structlog.get_logger("semel.worker")


class Worker:
    """Consumes one queue (``SEMEL_QUEUE``, or an app handler's) until stopped or the
    broker is gone for good."""

    def __init__(
        self,
        connection: AbstractRobustConnection,
        store: Store,
        routes: Routes,
        config: WorkerConfig,
        pipeline: PipelineConfig,
        observer: Observer | None = None,
    ) -> None:
        self._connection = connection
        self._store = store
        self._routes = routes
        self._config = config
        self._pipeline_config = pipeline
        self._observer = observer
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = False
        self._pipeline: Pipeline | None = None
        self._gate: StoreGate | None = None
        self._settler: Settler | None = None

    async def run(self, stop: asyncio.Event) -> int:
        """Consume until ``stop`` is set (exit 0) or the broker stays away (exit 1).

        Raises :class:`StoreMisconfigured` when a store ping found the store not
        set up for semel, once the handlers in flight were drained.
        """
        config = self._config
        consuming, publishing, intake, gate, pipeline = await through_drops(
            self._open, self._connection, config.broker_give_up
        )
        log.info("consuming", queue=config.queue, prefetch=config.prefetch)

        misconfigured: StoreMisconfigured | None = None
        try:
            broker_gone = await self._until_stopped(stop, gate)
        except StoreMisconfigured as exc:  # found by a ping: stopping like any stop first
            broker_gone, misconfigured = False, exc
        self._accepting = False
        try:
            await intake.pause()
            if broker_gone:
                log.error("broker unreachable for too long, exiting", give_up=config.broker_give_up)
                await self._cut_short()
                return EXIT_FAILURE
            await self._drain()
            with contextlib.suppress(Exception):  # the last turn's ACKs, before the close
                await asyncio.wait_for(intake.settled(), BROKER_CALL_TIMEOUT)
            for channel in (publishing, consuming):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(channel.close(), BROKER_CALL_TIMEOUT)
            if misconfigured is not None:
                raise misconfigured
            return EXIT_OK
        finally:
            pipeline.summary.flush()  # the last period's counts, before the exit
            self._let_go_of_threads()

    async def _open(
        self,
    ) -> tuple[AbstractRobustChannel, AbstractRobustChannel, Intake, StoreGate, Pipeline]:
        """Open the channels, check the queue and start consuming; run again from the
        start when the connection drops under it (their channels closed with it)."""
        config = self._config
        consuming = await self._connection.channel(publisher_confirms=False)
        await consuming.set_qos(prefetch_count=config.prefetch)
        publishing = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
        self._settler = settler = await Settler.open(publishing, Topology(config.queue))
        self._pipeline = pipeline = Pipeline(
            store=self._store,
            routes=self._routes,
            config=self._pipeline_config,
            settler=settler,
            observer=self._observer,
        )
        await consuming.get_queue(config.queue, ensure=True)  # it exists, or stop here
        # The channel is the intake's alone: its ACKs can be coalesced.
        intake = Intake(consuming, config.queue, self._on_message, coalesce=True)
        self._gate = gate = StoreGate(self._store, intake)
        self._accepting = True
        try:
            await self._store.ping()
            await intake.resume()
        except StoreUnavailable:
            gate.report_down()
        return consuming, publishing, intake, gate, pipeline

    @staticmethod
    def _let_go_of_threads() -> None:
        """The store closes next: stop renewing the keys of threads still running.
        Their leases outlast the process's exit (if not, the process ends first)."""
        keys = THREAD_LEASES.let_go()
        if keys:
            log.warning(
                "handler threads still running at exit; their keys stay held until their "
                "leases run out",
                keys=keys,
            )

    async def _until_stopped(self, stop: asyncio.Event, gate: StoreGate) -> bool:
        """Watch the store and the broker until ``stop``; ``True`` if the broker is gone."""
        stopping = asyncio.Event()
        store_watch = asyncio.create_task(gate.watch(stopping))
        stop_request = asyncio.create_task(stop.wait())
        broker_watch = asyncio.create_task(
            broker_gone_for(self._connection, self._config.broker_give_up)
        )
        watchers = {store_watch, stop_request, broker_watch}
        try:
            done, _ = await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
            if store_watch in done:  # it never ends by itself: surface its failure
                store_watch.result()
            return broker_watch in done
        finally:
            stopping.set()
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

    async def _on_message(self, message: Incoming) -> None:
        gate = self._gate
        if not self._accepting or gate is None or not gate.open:
            # Detached or paused, but the broker had already sent it: hand it back.
            with contextlib.suppress(Exception):
                await message.nack(requeue=True)
            return
        # A task of our own, not aiormq's: aiormq cancels its delivery tasks
        # when the channel drops, which would cut handlers short on every reconnect.
        task = asyncio.create_task(self._process(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _process(self, message: Incoming) -> None:
        assert self._pipeline is not None
        assert self._gate is not None
        try:
            decision = await self._pipeline.handle(message)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A bug, not a bad message: park a copy in the conflict queue
            # (nothing lost) and let it come back after the conflict delay.
            log.exception("delivery failed unexpectedly", delivery_tag=message.delivery_tag)
            with contextlib.suppress(Exception):
                assert self._settler is not None
                await self._settler.finish(message, NackToConflict())
            return
        if isinstance(decision, Requeue) and decision.store_down:
            if decision.outcome is Outcome.STORE_MISCONFIGURED:
                self._gate.stop(decision.error)
            else:
                self._gate.report_down()

    async def _drain(self) -> None:
        """Let in-flight deliveries finish for the grace period, then cut the rest short."""
        if self._tasks:
            log.info("stopping: waiting for handlers in flight", in_flight=len(self._tasks))
            await asyncio.wait(set(self._tasks), timeout=self._config.shutdown_grace)
        await self._cut_short()

    async def _cut_short(self) -> None:
        pending = set(self._tasks)
        if not pending:
            return
        # A delivery whose handler has ended is only recording and settling
        # its outcome: it is waited for like the others, never cut short.
        pipeline = self._pipeline
        running = {t for t in pending if pipeline is None or not pipeline.concluding(t)}
        log.warning("cutting handlers short, releasing their claims", count=len(running))
        for task in running:
            task.cancel()
        await asyncio.wait(pending, timeout=_CUT_SHORT_WAIT)
