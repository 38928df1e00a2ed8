"""The composition root: the one module that knows dependency-injector.

Only the selected store backend is imported and built: each backend is a
``Resource`` behind a ``Selector``, and a Resource is initialised only when
the selector picks it. Tests swap a collaborator with
``container.store.override(providers.Object(fake))``.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator

from dependency_injector import containers, providers

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


def _store_kind(settings: Settings) -> str:
    return settings.store.value


async def shutdown(container: containers.Container) -> None:
    """Close every Resource that was started; a no-op when none was."""
    pending = container.shutdown_resources()
    if pending is not None:
        await pending


class Container(containers.DeclarativeContainer):
    """Wires settings to the store; the consumer adds its broker parts here."""

    settings = providers.Singleton(load_settings)

    store = providers.Selector(
        providers.Callable(_store_kind, settings),
        sqlite=providers.Resource(open_backend, "sqlite", settings),
        postgres=providers.Resource(open_backend, "postgres", settings),
        redis=providers.Resource(open_backend, "redis", settings),
        dynamodb=providers.Resource(open_backend, "dynamodb", settings),
    )
