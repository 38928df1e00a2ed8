"""What every ``semel`` command shares: its one error line, its container, its broker channel.

A command builds a :class:`~semel.consumer.container.Container`, runs one async
action with it and closes whatever the action opened. Whatever goes wrong
ends the process with one line on stderr, secrets masked, and the exit code
the error's class carries (:mod:`semel.consumer.errors`): 2 for bad usage or
configuration, 1 for everything else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import NoReturn, TypeVar

import orjson
import typer
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.exceptions import AMQPError, ChannelInvalidStateError, ChannelNotFoundEntity

from semel.consumer.broker.topology import declare
from semel.consumer.container import Container, shutdown
from semel.consumer.errors import EXIT_FAILURE, SemelError
from semel.settings.redact import redact
from semel.stores.base import Store

T = TypeVar("T")

# What the client libraries raise when the broker is away or closes on us;
# TimeoutError is an OSError.
BROKER_ERRORS = (AMQPError, ChannelInvalidStateError, OSError)


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print one line to stderr and exit with ``code``; secrets are masked on the way."""
    typer.echo(f"semel: error: {redact(message)}", err=True)
    raise typer.Exit(code)


def echo_json(data: object) -> None:
    typer.echo(orjson.dumps(data).decode())


def run_with_container(action: Callable[[Container], Awaitable[T]]) -> T:
    """Run ``action`` with a fresh container; one error line and its exit code if it fails."""

    async def run() -> T:
        container = Container()
        try:
            container.settings()  # a bad setting fails here, before anything opens
            return await action(container)
        finally:
            await shutdown(container)

    try:
        return asyncio.run(run())
    except SemelError as exc:
        fail(str(exc) or type(exc).__name__, exc.exit_code)
    except BROKER_ERRORS as exc:
        fail(f"broker: {type(exc).__name__}: {exc}")


async def queue_exists(connection: AbstractConnection, queue: str) -> bool:
    """Whether ``queue`` exists (a passive declare, on a channel of its own: a
    missing queue closes the channel it is asked on)."""
    channel = await connection.channel()
    try:
        await channel.declare_queue(queue, passive=True)
    except ChannelNotFoundEntity:
        return False
    finally:
        with contextlib.suppress(*BROKER_ERRORS):
            await channel.close()
    return True


async def open_store(container: Container) -> Store:
    """The selected store, opened; the container closes it at shutdown."""
    store: Store = await container.store.async_()
    return store


def run_with_store(action: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``action`` with the selected store, opened first and closed after."""

    async def with_store(container: Container) -> T:
        return await action(await open_store(container))

    return run_with_container(with_store)


@contextlib.asynccontextmanager
async def confirm_channel(
    container: Container, *, declare_topology: bool = True, dead_letters_only: bool = False
) -> AsyncIterator[AbstractChannel]:
    """A publisher-confirm channel on the command's connection, returns raised.

    The topology is declared first (idempotent) unless ``declare_topology`` is
    false, so a command works against a broker the consumer never ran on. A
    command that only reads and replays dead letters (``dead_letters_only``)
    declares nothing where the DLQ exists, and never binds: ``SEMEL_QUEUE``
    may name an app handler's queue, whose bindings are its handler's patterns,
    not ``SEMEL_BINDING_KEYS``, and its retry tiers the handler's own.
    """
    connection: AbstractConnection = await container.tool_connection.async_()
    topology = container.topology()
    if dead_letters_only:
        if await queue_exists(connection, topology.names.dead_letter_queue):
            declare_topology = False
        topology = replace(topology, binding_keys=())
    if declare_topology:
        await declare(connection, topology)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    try:
        yield channel
    finally:
        # A channel the broker already closed has nothing left to close, and the
        # error that closed it is the one the command reports.
        with contextlib.suppress(*BROKER_ERRORS):
            await channel.close()


@contextlib.asynccontextmanager
async def letters_channel(
    container: Container,
) -> AsyncIterator[tuple[AbstractConnection, AbstractChannel]]:
    """The command's connection and a confirm channel on it, for a turn of the DLQ.

    The turn takes the DLQ's lock; one held by another command
    (:class:`~semel.consumer.broker.turn.LockHeld`) ends the command with one
    line and exit 1, like every ``SemelError``.
    """
    async with confirm_channel(container, dead_letters_only=True) as channel:
        connection: AbstractConnection = await container.tool_connection.async_()
        yield connection, channel
