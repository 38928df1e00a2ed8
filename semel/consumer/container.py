"""The composition root: the one module that reads ``Settings`` and knows dependency-injector.

Everything below it takes plain values: a store gets its URL and a
:class:`semel.stores.base.StoreConfig`, the pipeline a :class:`PipelineConfig`, the
topology a :class:`TopologySpec`. Only the selected store backend is imported
and built: each backend is a ``Resource`` behind a ``Selector``, and a
Resource is initialised only when the selector picks it. Tests swap a
collaborator with ``container.store.override(providers.Object(fake))``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from dependency_injector import containers, providers

from semel.consumer.broker.connection import open_connection, open_tool_connection
from semel.consumer.delivery.batching import BatchingStore, batched
from semel.consumer.delivery.completed_cache import CompletedCache
from semel.consumer.errors import ConfigurationError
from semel.consumer.ops.held import held_watcher
from semel.consumer.ops.httpd import open_operations
from semel.consumer.ops.logs import LogSetup
from semel.consumer.ops.metered import MeteredStore
from semel.consumer.ops.metrics import Metrics, MetricsObserver, timed
from semel.consumer.ops.tracing import traced
from semel.consumer.outboxes import outbox_watch_of, outbox_writer
from semel.consumer.plan import (
    QueuePlan,
    message_rules,
    plans_for,
    purge_interval,
    queue_names,
    required_target,
    topology_of,
)
from semel.consumer.runtime.purge import background_purge
from semel.consumer.runtime.worker import Worker
from semel.settings import ConfigError, Settings, load_settings
from semel.stores.base import Store, StoreConfig
from semel.stores.wrappers.deadline import DeadlineStore

TRANSACTIONAL = "postgres_tx"  # the backend key of transactional mode


def checked_settings(**overrides: object) -> Settings:
    """The environment's settings, ``overrides`` (a command's options) over them;
    a bad one is a configuration error (exit 2)."""
    try:
        return load_settings(**overrides)
    except ConfigError as exc:
        raise ConfigurationError(str(exc)) from None


def backend_of(settings: Settings) -> str:
    """The one place transactional mode is decided: it is a backend of its own."""
    return TRANSACTIONAL if settings.transactional else settings.store.value


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """The module of a backend and the keyword arguments of its ``open_store``."""

    module: str
    kwargs: dict[str, Any]


def store_options(settings: Settings) -> StoreOptions:
    """What the selected backend is opened with: plain values only."""
    config = StoreConfig(
        lock_ttl=settings.lock_ttl,
        retention=settings.retention,
        max_claims=settings.max_claims,
        key_prefix=settings.key_prefix,
    )
    pool = {"connections": settings.prefetch, "config": config}
    sql = {"table": settings.postgres_table}
    options: dict[str, tuple[str, dict[str, Any]]] = {
        "sqlite": ("semel.stores.sqlite", {"path": settings.sqlite_path, **sql, "config": config}),
        "postgres": ("semel.stores.postgres", {"dsn": settings.postgres_dsn, **sql, **pool}),
        TRANSACTIONAL: (
            "semel.stores.postgres.transactional",
            {
                "dsn": settings.postgres_dsn,
                **sql,
                "outbox_table": settings.outbox_table,
                "handler_timeout": settings.handler_timeout,
                **pool,
            },
        ),
        "redis": (
            "semel.stores.redis",
            {"url": settings.redis_url, "replicas_ack": settings.redis_replicas_ack, **pool},
        ),
        "dynamodb": (
            "semel.stores.dynamodb",
            {
                "table": settings.dynamodb_table,
                "endpoint_url": settings.dynamodb_endpoint_url,
                "region": settings.dynamodb_region,
                "data_plane": settings.dynamodb_client.value,
                **pool,
            },
        ),
    }
    module, kwargs = options[backend_of(settings)]
    return StoreOptions(module, kwargs)


# The extra of pyproject.toml that installs each backend's client library.
EXTRAS = {
    "postgres": "postgres",
    TRANSACTIONAL: "postgres",
    "redis": "redis",
    "dynamodb": "dynamodb",
}


def import_backend(settings: Settings) -> Any:
    """The selected backend's module; a client library not installed is a configuration
    error naming the extra that installs it."""
    backend = backend_of(settings)
    try:
        return importlib.import_module(store_options(settings).module)
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get(backend)
        if extra is None or (exc.name or "").startswith(("semel.stores", "semel.consumer")):
            raise
        raise ConfigurationError(
            f"SEMEL_STORE={settings.store.value} needs the {extra!r} extra, "
            f"not installed here (no module {exc.name!r}): pip install 'semel[{extra}]'"
        ) from None


async def open_backend(settings: Settings) -> AsyncIterator[Store]:
    """Import the selected backend lazily, open its store, close it at shutdown."""
    options = store_options(settings)
    module = import_backend(settings)
    store: Store = await module.open_store(**options.kwargs)
    try:
        yield store
    finally:
        await store.close()


def purges_in_background(settings: Settings) -> bool:
    """Whether the container's background purge runs: not in transactional mode,
    whose worker purges its keys and its outbox itself."""
    return not settings.transactional


def log_setup(settings: Settings) -> LogSetup:
    level = logging.getLevelNamesMapping()[settings.log_level.value.upper()]
    return LogSetup(as_json=settings.log_format.value == "json", level=level)


def completed_cache_of(settings: Settings) -> CompletedCache | None:
    """The process's keys known completed; ``None`` when ``SEMEL_COMPLETED_CACHE_SIZE=0``."""
    if settings.completed_cache_size == 0:
        return None
    return CompletedCache(
        settings.completed_cache_size, settings.completed_cache_ttl, settings.retention
    )


def workers_of(
    backend: str,
    plans: list[QueuePlan],
    connection: Any,
    store: Store,
    metrics: Metrics,
    completed: CompletedCache | None = None,
) -> list[Worker]:
    """A worker per planned queue, its handlers timed and its deliveries observed,
    all sharing ``completed`` (keys live in the one store, whichever queue
    completed them). Transactional mode's worker is another class, imported
    only when selected (it needs psycopg)."""
    make: Any = Worker
    if backend == TRANSACTIONAL:
        make = importlib.import_module("semel.consumer.transactional.worker").TransactionalWorker
    workers: list[Worker] = []
    for plan in plans:
        routes = plan.routes.mapped(lambda route: timed(route.handler, metrics))
        observer = traced(MetricsObserver(metrics), plan.worker.queue)
        workers.append(
            make(
                connection=connection,
                store=store,
                routes=routes,
                observer=observer,
                config=plan.worker,
                pipeline=replace(plan.pipeline, completed=completed),
            )
        )
    return workers


async def bounded(store: Store) -> AsyncIterator[DeadlineStore]:
    """``store`` with a deadline on every call; at shutdown, the calls it gave up on
    are waited for (a late claim released) while ``store`` is still open."""
    deadline = DeadlineStore(store)
    try:
        yield deadline
    finally:
        await deadline.settle()


async def batching(store: Store) -> AsyncIterator[Store]:
    """``store`` behind the batcher; at shutdown, the releases of claims granted to
    deliveries cancelled meanwhile are waited for while ``store`` is still open."""
    outer = batched(store)
    try:
        yield outer
    finally:
        if isinstance(outer, BatchingStore):
            await outer.settle()


async def shutdown(container: Container) -> None:
    """Close every Resource that was started; a no-op when none was.

    What uses the store goes first, while it is open, the health pinger and the
    purge before the calls they may have left out are settled: the container
    orders Resources by their direct arguments only, and the store is behind a
    Selector.
    """
    users = (
        container.health,
        container.purger,
        container.held,
        container.batched_store,
        container.bounded_store,
    )
    for user in users:
        if user.initialized and (closing := user.shutdown()) is not None:
            await closing
    pending = container.shutdown_resources()
    if pending is not None:
        await pending


class Container(containers.DeclarativeContainer):
    """Wires settings to the store, the broker connection, the worker and the commands."""

    settings = providers.Singleton(checked_settings)
    backend = providers.Callable(backend_of, settings)

    store = providers.Selector(
        backend,
        sqlite=providers.Resource(open_backend, settings),
        postgres=providers.Resource(open_backend, settings),
        postgres_tx=providers.Resource(open_backend, settings),
        redis=providers.Resource(open_backend, settings),
        dynamodb=providers.Resource(open_backend, settings),
    )

    # The handler or app to run, and the queues it is consumed from; the
    # commands other than `consume` see SEMEL_QUEUE's topology only.
    target = providers.Singleton(
        required_target, settings.provided.handler, settings.provided.app_dir
    )
    plans = providers.Singleton(plans_for, target, settings)
    topology = providers.Singleton(topology_of, settings)
    rules = providers.Singleton(message_rules, settings)
    logs = providers.Singleton(log_setup, settings)

    # The worker's connection is robust, waits for a broker that is away and
    # moves to another node when it loses its own; a command's tries each
    # address once and reports failure at once.
    connection = providers.Resource(
        open_connection, settings.provided.amqp_addresses, settings.provided.broker_give_up
    )
    tool_connection = providers.Resource(open_tool_connection, settings.provided.amqp_addresses)

    # Operations: the worker sees the store and the handler through meters,
    # and its pipeline reports to an observer (metrics, plus spans when
    # OpenTelemetry is configured). `health` serves /metrics, /healthz, /readyz.
    metrics = providers.Singleton(Metrics)
    # Innermost, every store call gets its deadline: a batch that hangs must
    # not hold up the deliveries queued behind it.
    bounded_store = providers.Resource(bounded, store)
    batched_store = providers.Resource(batching, bounded_store)
    metered_store = providers.Singleton(MeteredStore, batched_store, metrics)
    health = providers.Resource(open_operations, settings.provided.metrics_port, metrics)
    # Expired keys deleted while the consumer runs, so no cron job is needed.
    purger = providers.Resource(
        background_purge,
        store,
        providers.Callable(purge_interval, settings),
        metrics.provided.keys_purged.inc,
        providers.Callable(purges_in_background, settings),
    )
    # Messages the broker holds for dead-lettering, as a metric, if the
    # management API is configured.
    held = providers.Resource(
        held_watcher,
        settings.provided.management_url,
        providers.Callable(queue_names, plans),
        metrics.provided.held,
    )

    # The worker's duplicates are answered from here when known completed; the
    # front doors (semel.consumer.embedded) never use it.
    completed_cache = providers.Singleton(completed_cache_of, settings)
    workers = providers.Factory(
        workers_of, backend, plans, connection, metered_store, metrics, completed_cache
    )

    # The outbox: the writer any transaction stages messages with, and a
    # periodic check a running relay calls with its outbox (None: none).
    outbox = providers.Singleton(outbox_writer, settings)
    outbox_watch = providers.Singleton(outbox_watch_of, settings, metrics)


def container_with(**overrides: object) -> Container:
    """A container whose settings take ``overrides`` (a command's options) over the environment."""
    container = Container()
    if overrides:
        container.settings.override(providers.Singleton(checked_settings, **overrides))
    return container
