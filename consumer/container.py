"""The composition root: the one module that knows dependency-injector.

Only the selected store backend is imported and built: each backend is a
``Resource`` behind a ``Selector``, and a Resource is initialised only when
the selector picks it. The broker connection is a Resource too, opened only
by the commands that talk to the broker. Tests swap a collaborator with
``container.store.override(providers.Object(fake))``.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from typing import Any

from dependency_injector import containers, providers

from consumer.batching import batched
from consumer.broker import open_connection
from consumer.handler import load_handler
from consumer.httpd import open_operations
from consumer.metered import MeteredStore
from consumer.metrics import Metrics, MetricsObserver, timed
from consumer.runner import Worker
from consumer.tracing import traced
from settings import Settings, load_settings
from stores.base import Store


async def open_backend(kind: str, settings: Settings) -> AsyncIterator[Store]:
    """Import ``stores.<kind>`` lazily, open its store, close it at shutdown."""
    module = importlib.import_module(f"stores.{kind}")
    store: Store = await module.open_store(settings)
    try:
        yield store
    finally:
        await store.close()


def new_worker(settings: Settings, **collaborators: Any) -> Worker:
    """The worker; in transactional mode, the one that runs handlers in transactions."""
    if settings.transactional:
        from consumer.transactional import TransactionalWorker  # needs psycopg

        return TransactionalWorker(settings=settings, **collaborators)
    return Worker(settings=settings, **collaborators)


def _store_kind(settings: Settings) -> str:
    return settings.store.value


def _handler_spec(settings: Settings) -> str:
    return settings.handler


async def shutdown(container: containers.Container) -> None:
    """Close every Resource that was started; a no-op when none was."""
    pending = container.shutdown_resources()
    if pending is not None:
        await pending


class Container(containers.DeclarativeContainer):
    """Wires settings to the store, the broker connection and the worker."""

    settings = providers.Singleton(load_settings)

    store = providers.Selector(
        providers.Callable(_store_kind, settings),
        sqlite=providers.Resource(open_backend, "sqlite", settings),
        postgres=providers.Resource(open_backend, "postgres", settings),
        redis=providers.Resource(open_backend, "redis", settings),
        dynamodb=providers.Resource(open_backend, "dynamodb", settings),
    )

    handler = providers.Singleton(load_handler, providers.Callable(_handler_spec, settings))

    connection = providers.Resource(open_connection, settings)

    # Operations: the worker sees the store and the handler through meters,
    # and its pipeline reports to an observer (metrics, plus spans when
    # OpenTelemetry is configured). `health` serves /metrics, /healthz, /readyz.
    metrics = providers.Singleton(Metrics)
    metered_store = providers.Singleton(MeteredStore, providers.Singleton(batched, store), metrics)
    timed_handler = providers.Singleton(timed, handler, metrics)
    observer = providers.Singleton(
        traced, providers.Factory(MetricsObserver, metrics), settings.provided.queue
    )
    health = providers.Resource(open_operations, settings, metrics)

    worker = providers.Factory(
        new_worker,
        connection=connection,
        store=metered_store,
        handler=timed_handler,
        settings=settings,
        observer=observer,
    )
