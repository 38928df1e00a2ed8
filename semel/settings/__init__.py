"""semel's configuration: one model, loaded once, failing with one clear line."""

from __future__ import annotations

from pydantic import ValidationError

from semel.settings.model import (
    PREFIX,
    LogFormat,
    LogLevel,
    OutboxOrdering,
    QueueType,
    Settings,
    StoreKind,
)
from semel.settings.redact import redact

__all__ = [
    "PREFIX",
    "ConfigError",
    "LogFormat",
    "LogLevel",
    "OutboxOrdering",
    "QueueType",
    "Settings",
    "StoreKind",
    "derived",
    "load_settings",
    "redact",
]


class ConfigError(Exception):
    """A setting is invalid; the message is one line naming the variable."""


def load_settings(**overrides: object) -> Settings:
    """Read the environment; raise :class:`ConfigError` naming the first bad variable."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None


def derived(settings: Settings, **changes: object) -> Settings:
    """``settings`` with ``changes``, checked as a whole again (an app handler's own
    retries must still fit in the retention, say); the environment is not read."""
    try:
        return Settings.model_validate(settings.model_dump() | changes)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None


# Named in the error so an operator who set only DATABASE_URL finds the culprit.
_FALLBACKS = {
    "SEMEL_AMQP_URL": ("AMQP_URL", "CLOUDAMQP_URL"),
    "SEMEL_POSTGRES_DSN": ("DATABASE_URL",),
    "SEMEL_REDIS_URL": ("REDIS_URL",),
    "SEMEL_DYNAMODB_ENDPOINT_URL": ("AWS_ENDPOINT_URL_DYNAMODB",),
    "SEMEL_DYNAMODB_REGION": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}


def _one_line(exc: ValidationError) -> str:
    # hide_input_in_errors keeps values (and so secrets) out of ``msg``;
    # we build the line ourselves so no input ever leaks through repr either.
    err = exc.errors(include_url=False, include_input=False)[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    if not err["loc"]:
        return msg  # model-level checks name their variables themselves
    name = str(err["loc"][0]).upper()
    variable = name if name.startswith(PREFIX) else PREFIX + name
    fallbacks = _FALLBACKS.get(variable)
    if fallbacks:
        variable += f" (or {' / '.join(fallbacks)})"
    return f"{variable}: {msg}"
