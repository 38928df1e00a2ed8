"""Opening a store from a URL, without the consumer: :func:`open_store`.

The URL's scheme picks the backend, and only that backend's package is
imported, so a Redis user never needs psycopg or boto3 installed::

    sqlite:///relative/path.db              a file, relative to the working directory
    sqlite:////absolute/path.db             a file, by its absolute path
    postgresql://user@host:5432/db          passed on to psycopg as is (postgres:// too)
    redis://[user:pass@]host:6379/0         one server (rediss:// for TLS, unix:// too)
    redis+sentinel://s1:26379,s2:26379/<service>[/<db>]
    redis+cluster://n1:6379,n2:6379         (rediss+sentinel://, rediss+cluster://: TLS)
    dynamodb://<table>[?region=<region>&endpoint_url=<url>]

Errors never repeat the URL: it may carry a password.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from semel.stores.base import Store, StoreConfig

# The defaults of the settings the consumer opens its store with.
TABLE = "semel_keys"
REGION = "us-east-1"
# Connections pooled (PostgreSQL: within its pool's own bounds; Redis: per server;
# DynamoDB: requests at a time): enough for a program that is not a busy consumer.
CONNECTIONS = 10

SQLITE_FORM = "sqlite:///relative/path.db or sqlite:////absolute/path.db"
DYNAMODB_FORM = "dynamodb://<table>[?region=<region>&endpoint_url=<url>]"
DYNAMODB_QUERY = ("region", "endpoint_url")


def _sqlite(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    path = unquote(parts.path[1:])
    if parts.netloc or not parts.path.startswith("/") or not path or parts.query:
        raise ValueError(f"a SQLite store URL is {SQLITE_FORM}")
    return {"path": path}


def _as_is(name: str) -> Callable[[str], dict[str, Any]]:
    # PostgreSQL and Redis read the whole URL themselves (libpq; semel.stores.redis.url).
    return lambda url: {name: url}


def _dynamodb(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    table = unquote(parts.netloc)  # not .hostname: that would lower the table's name
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if not table or parts.path not in ("", "/") or set(query) - set(DYNAMODB_QUERY):
        raise ValueError(f"a DynamoDB store URL is {DYNAMODB_FORM}")
    # As boto3 and the consumer's settings do: the environment's region by default.
    region = (
        query.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    )
    # No endpoint: AWS itself, or AWS_ENDPOINT_URL_DYNAMODB, which boto3 reads.
    return {"table": table, "region": region or REGION, "endpoint_url": query.get("endpoint_url")}


@dataclass(frozen=True, slots=True)
class Backend:
    """How a URL's scheme opens its store."""

    package: str  # under semel.stores; its open_store is called
    extra: str | None  # pyproject's extra installing its client library, if any
    options: Mapping[str, Any]  # the keyword options the caller may give, and their defaults
    read: Callable[[str], dict[str, Any]]  # the URL as the package's open_store takes it


_SQLITE = Backend("sqlite", None, {"table": TABLE}, _sqlite)
_POSTGRES = Backend(
    "postgres", "postgres", {"table": TABLE, "connections": CONNECTIONS}, _as_is("dsn")
)
_REDIS = Backend("redis", "redis", {"connections": CONNECTIONS, "replicas_ack": 0}, _as_is("url"))
_DYNAMODB = Backend("dynamodb", "dynamodb", {"connections": CONNECTIONS}, _dynamodb)

# Every form semel.stores.redis.url reads.
REDIS_SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
)

SCHEMES: Mapping[str, Backend] = {
    "sqlite": _SQLITE,
    "postgresql": _POSTGRES,
    "postgres": _POSTGRES,
    **dict.fromkeys(REDIS_SCHEMES, _REDIS),
    "dynamodb": _DYNAMODB,
}


def backend_of(url: str) -> tuple[str, Backend]:
    """The URL's scheme and its backend; :class:`ValueError` for a scheme none has."""
    scheme, sep, _ = url.partition(":")
    scheme = scheme.lower()
    backend = SCHEMES.get(scheme)
    if backend is None:
        named = f"the URL scheme {scheme!r}" if sep else "a URL without a scheme"
        accepted = ", ".join(f"{name}://" for name in SCHEMES)
        raise ValueError(f"no store for {named}; accepted: {accepted}")
    return scheme, backend


def _imported(scheme: str, backend: Backend) -> ModuleType:
    try:
        return importlib.import_module(f"semel.stores.{backend.package}")
    except ModuleNotFoundError as exc:
        if backend.extra is None or (exc.name or "").startswith("semel"):
            raise
        raise ModuleNotFoundError(
            f"a {scheme}:// store needs the {backend.extra!r} extra, "
            f"not installed here (no module {exc.name!r}): pip install 'semel[{backend.extra}]'",
            name=exc.name,
        ) from None


async def open_store(url: str, *, config: StoreConfig | None = None, **options: Any) -> Store:
    """Open the store ``url`` names (the forms are in this module's docstring).

    ``config`` holds the lease, the retention, the claims allowed and the key
    prefix (:class:`StoreConfig`'s defaults when ``None``). ``options`` are the
    backend's own: ``table`` (SQLite, PostgreSQL), ``connections``
    (PostgreSQL, Redis, DynamoDB) and ``replicas_ack`` (Redis).

    Raises :class:`ValueError` for a scheme no backend has or a SQLite or
    DynamoDB URL of another form, :class:`TypeError` for an option the backend
    does not take, :class:`ModuleNotFoundError` naming the extra to install when
    the backend's client library is missing, and what the backend's own
    ``open_store`` raises: :class:`~semel.stores.errors.StoreUnavailable` for a
    PostgreSQL server that does not answer, say, or
    :class:`~semel.stores.errors.StoreMisconfigured` for a Redis URL it cannot read.
    """
    scheme, backend = backend_of(url)
    unknown = set(options) - set(backend.options)
    if unknown:
        raise TypeError(
            f"open_store(): a {scheme}:// store takes no {', '.join(sorted(unknown))} "
            f"(its options: {', '.join(backend.options)})"
        )
    kwargs = {**backend.options, **options, **backend.read(url)}
    module = _imported(scheme, backend)
    store: Store = await module.open_store(**kwargs, config=config or StoreConfig())
    return store
