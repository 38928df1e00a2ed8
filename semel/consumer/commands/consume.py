"""``semel consume``: build the worker from the container and run it until told to stop.

This is the Procfile's worker. It opens what the worker needs in an order that
fails early (the health endpoint, the handler, the store, then the broker),
runs the outbox relay beside the workers (in transactional mode, or when
``SEMEL_OUTBOX_RELAY=true``), and runs on uvloop where it is installed: the
worker spends much of each delivery in the event loop's own machinery
(transports, callbacks), which uvloop does in C. Start-up problems end the
process with one line and the exit code their error class carries
(:mod:`semel.consumer.errors`): a bad setting, handler or topology is the
operator's to fix (2); a store or broker that cannot be reached is worth a
restart by the supervisor (1).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any

import structlog
import typer
from aiormq.exceptions import AMQPError
from typer import Argument, Option

from semel.consumer.broker.connection import through_drops
from semel.consumer.broker.delays import DelayReturns
from semel.consumer.broker.topology import declare
from semel.consumer.commands.common import fail
from semel.consumer.container import Container, container_with, shutdown
from semel.consumer.delivery.thread_watch import THREAD_LEASES, exit_now
from semel.consumer.errors import BrokerUnavailable, SemelError
from semel.consumer.ops.collector import tune_gc
from semel.consumer.ops.health import Health
from semel.consumer.ops.logs import configure
from semel.consumer.outboxes import relaying, relays_in_consumer
from semel.consumer.runtime.worker import Worker
from semel.stores.base import Store
from semel.stores.errors import StoreError

LOOP_FACTORY: Callable[[], asyncio.AbstractEventLoop] | None = None
try:
    import uvloop

    LOOP_FACTORY = uvloop.new_event_loop
except ImportError:  # e.g. Windows: asyncio's own loop
    pass

log = structlog.get_logger("semel.consume")


async def run_consumer(
    container: Container | None = None,
    stop: asyncio.Event | None = None,
    started: Callable[[], None] | None = None,
) -> int:
    """Run the consumer until ``stop`` (default: SIGTERM / SIGINT); returns the exit code.

    ``started`` is called once everything is open, just before the workers
    consume. Raises a :class:`semel.consumer.errors.SemelError` when start-up fails.
    """
    container = container or Container()
    configure(container.logs())  # a bad setting fails here, before anything opens
    plans = container.plans()  # so does a handler that is not set or cannot load
    try:
        # Served first, so /healthz answers while the store and the broker are awaited.
        health: Health = await container.health.async_()
        # Opened before the broker, so a store error stops start-up early. A
        # test's Object override is not awaitable; the backend Resource is.
        store = container.store()
        if inspect.isawaitable(store):
            await store
        metered: Any = container.metered_store()  # awaitable unless a test overrode the store
        if inspect.isawaitable(metered):
            metered = await metered
        health.watch_store(metered)
        await _warn_of_store_set_up(metered)
        connection = await container.connection.async_()
        health.watch_broker(connection)
        container.metrics().count_reconnects(connection)
        give_up = container.settings().broker_give_up
        for plan in plans:
            await through_drops(partial(declare, connection, plan.topology), connection, give_up)
        workers: list[Worker] = await container.workers.async_()
        await container.purger.async_()
        await container.held.async_()
        delays = [
            await through_drops(
                partial(DelayReturns.start, connection, plan.topology), connection, give_up
            )
            for plan in plans
        ]
        settings = container.settings()
        relay: Any = contextlib.nullcontext()
        if relays_in_consumer(settings):
            # Around the workers: what their handlers committed last is sent on the way out.
            units = metered if settings.transactional else None
            watch = container.outbox_watch()
            health.watch_outbox(watch.detail)
            relay = relaying(settings, connection, units, watch)
        try:
            async with relay:
                if started is not None:
                    started()
                return await run_all(workers, stop or stop_on_signals())
        finally:
            for returns in delays:
                await returns.stop()
    except AMQPError as exc:
        raise BrokerUnavailable(str(exc) or type(exc).__name__) from None
    finally:
        await shutdown(container)


async def run_all(workers: list[Worker], stop: asyncio.Event) -> int:
    """Run every queue's worker until ``stop``, or until one of them ends (the broker
    gone for good, a store not set up for semel): then all stop, and the exit code
    is the worst of theirs."""
    together = asyncio.Event()
    waiter = asyncio.create_task(stop.wait())
    waiter.add_done_callback(lambda _: together.set())

    async def run(worker: Worker) -> int:
        try:
            return await worker.run(together)
        finally:
            together.set()  # one ended: the others stop too

    try:
        codes = await asyncio.gather(*(run(w) for w in workers), return_exceptions=True)
    finally:
        waiter.cancel()
    exit_codes = [code for code in codes if not isinstance(code, BaseException)]
    if len(exit_codes) < len(codes):
        raise next(code for code in codes if isinstance(code, BaseException))
    return max(exit_codes)


async def _warn_of_store_set_up(store: Store) -> None:
    """Say what the store's set-up risks (an evicting Redis, say), if it answers now;
    a store that is away is waited for as usual, and ``semel migrate`` says it too."""
    try:
        for warning in await store.warnings():
            log.warning("store set-up", warning=warning)
    except StoreError:
        pass


def stop_on_signals() -> asyncio.Event:
    """An event set by the first SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def request_stop(signum: signal.Signals) -> None:
        if not stop.is_set():
            log.info("stop requested", signal=signum.name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, request_stop, signum)
    return stop


def consume_command(
    target: Annotated[
        str | None,
        Argument(
            metavar="TARGET",
            help="The handler or app to run, as package.module:attribute (default: SEMEL_HANDLER).",
            show_default=False,
        ),
    ] = None,
    app_dir: Annotated[
        str | None,
        Option(
            metavar="DIR",
            help="Import the handler from DIR first (default: SEMEL_APP_DIR, "
            "or the folder semel is started in).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the consumer until SIGTERM / SIGINT (the Procfile's worker)."""
    overrides = {"app_dir": app_dir, "handler": target}
    container = container_with(**{k: v for k, v in overrides.items() if v is not None})
    try:
        try:
            with asyncio.Runner(loop_factory=LOOP_FACTORY) as runner:
                # The process is the worker's alone: its collector is set for it.
                code = runner.run(run_consumer(container, started=tune_gc))
        except SemelError as exc:
            fail(str(exc) or type(exc).__name__, exc.exit_code)
        raise typer.Exit(code)
    except typer.Exit as leaving:
        if THREAD_LEASES.any_running():
            # Everything is closed; a handler thread still runs under a lease no
            # longer renewed. It ends with the process now, not after the
            # interpreter's clean-up, which could outlast the lease.
            exit_now(leaving.exit_code)
        raise


def register(app: typer.Typer) -> None:
    """Add ``consume`` to the ``semel`` application."""
    app.command("consume")(consume_command)
