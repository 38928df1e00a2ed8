"""``semel.Publisher`` and ``semel.SyncPublisher``: the publishers, opened from settings.

The classes of ``semel.consumer.producer`` take plain values; these add
``open()``, which reads ``SEMEL_AMQP_URL``, ``SEMEL_EXCHANGE``,
``SEMEL_KEY_SOURCE`` and ``SEMEL_BROKER_GIVE_UP`` from the environment,
settings given in code winning (a :class:`~semel.settings.Settings`, or
keyword arguments named like its fields). A bad value is a
:class:`~semel.consumer.errors.ConfigurationError` with one line naming it.
"""

from __future__ import annotations

from typing import Any, Self

import structlog

from semel.consumer.container import checked_settings, log_setup
from semel.consumer.errors import ConfigurationError
from semel.consumer.names import CONFIRM_TIMEOUT
from semel.consumer.ops.logs import configure
from semel.consumer.producer import publisher, sync
from semel.consumer.producer.opening import Opening
from semel.consumer.producer.publisher import PUBLISH_WINDOW
from semel.consumer.producer.retry import Retry
from semel.settings import ConfigError, Settings, derived


def publisher_settings(settings: Settings | None, overrides: dict[str, Any]) -> Settings:
    """The environment's settings (or ``settings``), ``overrides`` over them."""
    unknown = sorted(set(overrides) - set(Settings.model_fields))
    if unknown:
        raise ConfigurationError(f"not a semel setting: {', '.join(unknown)}")
    try:
        if settings is None:
            return checked_settings(**overrides)
        return derived(settings, **overrides) if overrides else settings
    except ConfigError as exc:
        raise ConfigurationError(str(exc)) from None


def _configure_logs(settings: Settings) -> None:
    if not structlog.is_configured():
        # As the engine does: semel's lines follow SEMEL_LOG_LEVEL (info by
        # default, so no debug line in an application that set nothing up),
        # unless the application configured structlog; its logging stays its own.
        configure(log_setup(settings), stdlib=False)


def _connect_options(settings: Settings) -> dict[str, Any]:
    return {
        "exchange": settings.exchange,
        "key_source": settings.key_source,
        "give_up": settings.broker_give_up,
    }


class Publisher(publisher.Publisher):
    """:class:`semel.consumer.producer.Publisher`, with :meth:`open`."""

    @classmethod
    def open(
        cls,
        settings: Settings | None = None,
        /,
        *,
        retry: Retry | None = None,
        window: int = PUBLISH_WINDOW,
        confirm_timeout: float = CONFIRM_TIMEOUT,
        **overrides: Any,
    ) -> Opening[Self]:
        """``async with Publisher.open() as publisher:`` (or ``await`` it and
        ``close()`` it later): a publisher on ``SEMEL_EXCHANGE`` that places
        keys per ``SEMEL_KEY_SOURCE``. ``overrides`` are settings
        (``exchange="orders"``); a bad one raises here."""
        chosen = publisher_settings(settings, overrides)
        _configure_logs(chosen)
        return cls.connect(
            chosen.amqp_addresses,
            **_connect_options(chosen),
            retry=retry,
            window=window,
            confirm_timeout=confirm_timeout,
        )


class SyncPublisher(sync.SyncPublisher):
    """:class:`semel.consumer.producer.SyncPublisher`, with :meth:`open`."""

    @classmethod
    def open(
        cls,
        settings: Settings | None = None,
        /,
        *,
        retry: Retry | None = None,
        window: int = PUBLISH_WINDOW,
        confirm_timeout: float = CONFIRM_TIMEOUT,
        **overrides: Any,
    ) -> Self:
        """``with SyncPublisher.open() as publisher:``, or keep the returned
        publisher and ``close()`` it at exit; connected when it returns."""
        chosen = publisher_settings(settings, overrides)
        _configure_logs(chosen)
        return cls.connect(
            chosen.amqp_addresses,
            **_connect_options(chosen),
            retry=retry,
            window=window,
            confirm_timeout=confirm_timeout,
        )


__all__ = ["Publisher", "SyncPublisher", "publisher_settings"]
