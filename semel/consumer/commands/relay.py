"""``semel relay``: the outbox relay alone, until SIGTERM / SIGINT.

It publishes what any process staged in the outbox table
(``SEMEL_OUTBOX_TABLE``), woken by ``LISTEN/NOTIFY`` unless
``SEMEL_OUTBOX_LISTEN=false``, sweeping the table every second, purging rows
sent longer ago than ``SEMEL_RETENTION``; ``/healthz``, ``/readyz`` (the
broker connection, and the outbox's detail) and ``/metrics`` are served on
``SEMEL_METRICS_PORT`` as by ``semel consume``.
A stop ends the pass under way, sends what is left within a bound, and
exits 0: each step of the stop has a time of its own
(:mod:`semel.consumer.stopping`), and :data:`EXIT_LIMIT` seconds
after the request the process exits whatever still hangs. Start-up problems
end the process with one line: a missing outbox table (2: run ``semel
migrate``), PostgreSQL or the broker away (1).
"""

from __future__ import annotations

import asyncio

import structlog
import typer
from aiormq.exceptions import AMQPError

from semel.consumer.commands.common import fail
from semel.consumer.commands.consume import LOOP_FACTORY, stop_on_signals
from semel.consumer.container import Container, shutdown
from semel.consumer.errors import BrokerUnavailable, SemelError
from semel.consumer.names import BROKER_CALL_TIMEOUT
from semel.consumer.ops.health import Health
from semel.consumer.ops.logs import configure
from semel.consumer.outboxes import relaying
from semel.consumer.stopping import UNWIND, exit_after, within

# Seconds from the stop request to the process's end, whatever hangs: within
# the 30 s a supervisor (Kubernetes' default grace period) gives before SIGKILL.
EXIT_LIMIT = 25.0

log = structlog.get_logger("semel.relay")


async def run_relay(
    container: Container | None = None,
    stop: asyncio.Event | None = None,
    *,
    exit_limit: float | None = None,
) -> int:
    """Relay until ``stop`` (default: SIGTERM / SIGINT); returns the exit code.

    With ``exit_limit`` the process exits that many seconds after ``stop``
    is set if it has not by then: the command's last resort.
    Raises a :class:`semel.consumer.errors.SemelError` when start-up fails.
    """
    container = container or Container()
    configure(container.logs())  # a bad setting fails here, before anything opens
    settings = container.settings()
    stop = stop or stop_on_signals()
    try:
        health: Health = await container.health.async_()
        connection = await container.connection.async_()
        health.watch_broker(connection)
        health.without_store()  # a relay alone holds no store: ready is the broker
        watch = container.outbox_watch()
        health.watch_outbox(watch.detail)
        async with relaying(settings, connection, watch=watch):
            log.info(
                "relaying",
                table=settings.outbox_table,
                listen=settings.outbox_listen,
                ordering=settings.outbox_ordering.value,
            )
            await stop.wait()
            if exit_limit is not None:
                exit_after(exit_limit)
        return 0
    except AMQPError as exc:
        raise BrokerUnavailable(str(exc) or type(exc).__name__) from None
    finally:
        await within(
            BROKER_CALL_TIMEOUT + UNWIND,
            "closing the broker connection and the health endpoint",
            shutdown(container),
        )


def relay_command() -> None:
    """Run the outbox relay alone until SIGTERM / SIGINT."""
    try:
        with asyncio.Runner(loop_factory=LOOP_FACTORY) as runner:
            code = runner.run(run_relay(exit_limit=EXIT_LIMIT))
    except SemelError as exc:
        fail(str(exc) or type(exc).__name__, exc.exit_code)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add ``relay`` to the ``semel`` application."""
    app.command("relay")(relay_command)
