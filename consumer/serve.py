"""``semel consume``: build the worker from the container and run it until told to stop.

Start-up problems end the process with one line and a documented exit code:
a bad setting, handler or topology is the operator's to fix (2); a store or
broker that cannot be reached is worth a restart by the supervisor (1).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
from typing import Any

import structlog
from aiormq.exceptions import AMQPError

from consumer.broker import BrokerUnavailable
from consumer.container import Container, shutdown
from consumer.handler import HandlerLoadError
from consumer.health import Health
from consumer.httpd import ListenError
from consumer.logs import configure
from consumer.runner import Worker
from consumer.topology import TopologyMismatch, declare
from settings import ConfigError, redact
from stores.errors import StoreError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

log = structlog.get_logger("semel.consume")


class StartupError(Exception):
    """Start-up failed; ``code`` is the exit code, the message one line."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


async def consume(container: Container | None = None, stop: asyncio.Event | None = None) -> int:
    """Run the consumer until ``stop`` (default: SIGTERM / SIGINT); returns the exit code.

    Raises :class:`StartupError`.
    """
    container = container or Container()
    try:
        settings = container.settings()
    except ConfigError as exc:
        raise StartupError(str(exc), EXIT_USAGE) from None
    configure(settings.log_format, logging.getLevelNamesMapping()[settings.log_level.upper()])
    try:
        # Served first, so /healthz answers while the store and the broker are awaited.
        health: Health = await container.health.async_()
        container.handler()  # a handler that cannot load stops us before any connection
        # Opened before the broker, so a store error stops start-up early. A
        # test's Object override is not awaitable; the backend Resource is.
        store = container.store()
        if inspect.isawaitable(store):
            await store
        metered: Any = container.metered_store()  # awaitable unless a test overrode the store
        if inspect.isawaitable(metered):
            metered = await metered
        health.watch_store(metered)
        connection = await container.connection.async_()
        health.watch_broker(connection)
        container.metrics().count_reconnects(connection)
        await declare(connection, settings)
        worker: Worker = await container.worker.async_()
        return await worker.run(stop or stop_on_signals())
    except (HandlerLoadError, TopologyMismatch) as exc:
        raise StartupError(str(exc), EXIT_USAGE) from None
    except (StoreError, BrokerUnavailable, AMQPError, ListenError) as exc:
        raise StartupError(redact(str(exc)) or type(exc).__name__, EXIT_FAILURE) from None
    finally:
        await shutdown(container)


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
