"""Every ``SEMEL_*`` setting as one pydantic-settings model.

One field, one environment variable. Fallback variables that platforms set
(``DATABASE_URL``, ``REDIS_URL``, ``AMQP_URL``, ``CLOUDAMQP_URL``,
``AWS_ENDPOINT_URL_DYNAMODB``) are read through validation aliases, so the
``SEMEL_`` name always wins when both are present.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from semel.settings.amqp import amqp_addresses as parse_addresses
from semel.settings.consistency import PREFIX, TRANSACTIONAL_CONNECTIONS, contradiction, retry_chain
from semel.settings.durations import MessageTtl

__all__ = [
    "PREFIX",
    "TRANSACTIONAL_CONNECTIONS",
    "LogFormat",
    "LogLevel",
    "QueueType",
    "Settings",
    "StoreKind",
]


class StoreKind(StrEnum):
    """The idempotency store backends."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"
    REDIS = "redis"
    DYNAMODB = "dynamodb"


class QueueType(StrEnum):
    QUORUM = "quorum"
    CLASSIC = "classic"


class LogFormat(StrEnum):
    CONSOLE = "console"
    JSON = "json"


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


def _env(name: str, *fallbacks: str) -> AliasChoices:
    return AliasChoices(PREFIX + name, *fallbacks)


def _check_url(value: str, schemes: tuple[str, ...]) -> str:
    # Never echo the value: a URL may carry a password.
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError("not a parsable URL") from None
    if parts.scheme not in schemes:
        raise ValueError("scheme must be one of " + ", ".join(f"{s}://" for s in schemes))
    if not parts.hostname and parts.scheme not in ("postgresql", "postgres", "unix"):
        raise ValueError("URL has no host")
    return value


_REDIS_MODES = {"sentinel": "/<service>[/<db>]", "cluster": "[/0]"}
_REDIS_SCHEMES = (
    *("redis", "rediss", "unix"),
    *(f"{s}+{m}" for m in _REDIS_MODES for s in ("redis", "rediss")),
)


def _check_redis_url(value: str) -> str:
    """One server, a Sentinel-managed primary or a Cluster (semel.stores.redis.url reads the
    URL; this refuses what it could not read, without ever echoing the URL)."""
    # The hosts are split by hand: several hosts with an IPv6 one among them
    # are refused by urlsplit on some Python 3.11 releases (3.11.2, Debian 12's).
    scheme, _, rest = value.partition("://")
    end = min([i for i in (rest.find(c) for c in "/?#") if i >= 0], default=len(rest))
    netloc = rest[:end]
    try:
        parts = urlsplit(f"{scheme}://host{rest[end:]}")
    except ValueError:
        raise ValueError("not a parsable URL") from None
    if parts.scheme not in _REDIS_SCHEMES:
        raise ValueError("scheme must be one of " + ", ".join(f"{s}://" for s in _REDIS_SCHEMES))
    mode = parts.scheme.partition("+")[2]
    if not mode:
        return _check_url(value, _REDIS_SCHEMES)
    for host in netloc.rpartition("@")[2].split(","):
        try:
            if not urlsplit(f"//{host}").hostname:
                raise ValueError("every host needs a name")
            urlsplit(f"//{host}").port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise ValueError(
                f"hosts must read host[:port],host[:port]: {parts.scheme}://"
                f"[user:password@]host:port,host:port{_REDIS_MODES[mode]}"
            ) from None
    path = parts.path.strip("/")
    if mode == "cluster" and path not in ("", "0"):
        raise ValueError("a Redis Cluster has only database 0")
    service, _, db = path.partition("/")
    if mode == "sentinel" and (not service or (db and not db.isdigit())):
        raise ValueError(
            f"needs the monitored primary's name: {parts.scheme}://host:26379/<service>[/<db>]"
        )
    return value


Seconds = Annotated[float, Field(gt=0)]


class OutboxOrdering(StrEnum):
    """The order the outbox relay publishes in (``SEMEL_OUTBOX_ORDERING``)."""

    OLDEST_FIRST = "oldest-first"  # per batch; per key while one relay runs
    PER_KEY = "per-key"  # per key across relays: a key's next message waits for its last


class DynamoDBClient(StrEnum):
    """What sends the DynamoDB store's per-message calls (``SEMEL_DYNAMODB_CLIENT``)."""

    LEAN = "lean"  # semel's own HTTP/1.1 client: about a fifth of botocore's CPU a call
    BOTOCORE = "botocore"  # boto3's client for every call, as before the lean one


class Settings(BaseSettings):
    """semel's whole configuration, read from the environment."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        case_sensitive=False,
        extra="ignore",
        populate_by_name=True,
        hide_input_in_errors=True,
    )

    store: StoreKind = StoreKind.SQLITE
    amqp_url: str = Field(
        "amqp://guest:guest@localhost:5672/",
        validation_alias=_env("AMQP_URL", "AMQP_URL", "CLOUDAMQP_URL"),
    )
    postgres_dsn: str = Field(
        "postgresql://localhost/postgres",
        validation_alias=_env("POSTGRES_DSN", "DATABASE_URL"),
    )
    redis_url: str = Field(
        "redis://localhost:6379/0", validation_alias=_env("REDIS_URL", "REDIS_URL")
    )
    # Replicas every Redis write waits for (WAIT) before it counts as stored.
    redis_replicas_ack: int = Field(0, ge=0, le=16)
    postgres_table: str = Field("semel_keys", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
    # Handlers write to PostgreSQL in the transaction that completes their key.
    transactional: bool = False
    outbox_table: str = Field("semel_outbox", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
    # The relay in `semel consume` (always on in transactional mode).
    outbox_relay: bool = False
    # Relays wake on PostgreSQL's NOTIFY after each commit, not only on their sweep.
    outbox_listen: bool = True
    outbox_ordering: OutboxOrdering = OutboxOrdering.OLDEST_FIRST
    # Unsent messages older than this show in /readyz and the logs.
    outbox_stale_after: Seconds = 60.0
    dynamodb_table: str = Field("semel_keys", pattern=r"^[A-Za-z0-9_.-]{3,255}$")
    dynamodb_endpoint_url: str | None = Field(
        None,
        validation_alias=_env("DYNAMODB_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB"),
    )
    dynamodb_region: str = Field(
        "us-east-1", validation_alias=_env("DYNAMODB_REGION", "AWS_REGION", "AWS_DEFAULT_REGION")
    )
    # A way back to botocore for every call, should an endpoint or a network
    # path (a proxy, an unusual TLS set-up) not suit the lean client.
    dynamodb_client: DynamoDBClient = DynamoDBClient.LEAN
    sqlite_path: str = "./semel.db"
    # No default: a worker that forgot it would acknowledge real messages with
    # the bundled example. `semel consume` refuses to start without it; the
    # other commands never run a handler.
    handler: str | None = Field(None, pattern=r"^[\w.]+:[\w.]+$")
    # The folder the handler is imported from, put first on the import path
    # (uvicorn's --app-dir): by default the one the process is started in.
    app_dir: str = Field(".", min_length=1)
    exchange: str = Field("semel.events", min_length=1, max_length=200)
    queue: str = Field("semel.work", min_length=1, max_length=200)
    binding_keys: Annotated[list[str], NoDecode] = ["#"]
    queue_type: QueueType = QueueType.QUORUM
    key_source: str = Field("header:Idempotency-Key", pattern=r"^(header:.+|message_id|body:.+)$")
    key_prefix: str = Field("semel", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    max_body_bytes: int = Field(1_048_576, gt=0)
    prefetch: int = Field(256, ge=1, le=65535)
    lock_ttl: Seconds = 30.0
    retention: Seconds = 86_400.0
    retry_delays: Annotated[list[float], NoDecode] = [1.0, 5.0, 30.0, 120.0]
    max_attempts: int = Field(5, ge=1)
    conflict_delay: Seconds = 5.0
    max_claims: int = Field(10, ge=1)
    # Keys known completed, kept by each worker process so that most duplicates
    # are ACKed without a store call (semel.consumer.delivery.completed_cache).
    completed_cache_size: int = Field(100_000, ge=0)
    completed_cache_ttl: Seconds = 300.0
    handler_timeout: Seconds = 300.0
    shutdown_grace: Seconds = 30.0
    broker_give_up: Seconds = 300.0
    # An archived dead letter leaves the DLQ this long after it was archived
    # (semel dlq archive; semel.consumer.broker.letter_manage).
    dlq_archive_retention: MessageTtl = timedelta(days=14)
    metrics_port: int = Field(9464, ge=0, le=65535)
    # The management API, for `semel queues` and semel_queue_messages_dlx; a
    # worker asks it only when this is set (the plugin may not run).
    management_url: str | None = Field(None, pattern=r"^https?://")
    log_format: LogFormat = LogFormat.CONSOLE
    # Routine deliveries (processed, duplicate) are logged at debug: a line
    # per message costs more than the rest of a duplicate's processing.
    log_level: LogLevel = LogLevel.INFO

    @field_validator("binding_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            keys = [k.strip() for k in value.split(",") if k.strip()]
            if not keys:
                raise ValueError("needs at least one routing key")
            return keys
        return value

    @field_validator("retry_delays", mode="before")
    @classmethod
    def _split_delays(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                delays = [float(d) for d in value.split(",") if d.strip()]
            except ValueError:
                raise ValueError("must be comma-separated seconds, e.g. 1,5,30") from None
            return delays
        return value

    @field_validator("retry_delays")
    @classmethod
    def _positive_delays(cls, value: list[float]) -> list[float]:
        if not value or any(d <= 0 for d in value):
            raise ValueError("needs one or more delays, each greater than 0")
        return value

    @field_validator("amqp_url")
    @classmethod
    def _amqp(cls, value: str) -> str:
        parse_addresses(value)  # one address or a cluster's: see semel.settings.amqp
        return value

    @property
    def amqp_addresses(self) -> tuple[str, ...]:
        """The broker addresses of ``SEMEL_AMQP_URL``, one URL per node."""
        return parse_addresses(self.amqp_url)

    @field_validator("postgres_dsn")
    @classmethod
    def _postgres(cls, value: str) -> str:
        return _check_url(value, ("postgresql", "postgres"))

    @field_validator("redis_url")
    @classmethod
    def _redis(cls, value: str) -> str:
        return _check_redis_url(value)

    @field_validator("dynamodb_endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        return None if not value else _check_url(value, ("http", "https"))

    def retry_chain(self) -> float:
        """Seconds a message can wait in the retry tiers, first attempt to last."""
        return retry_chain(self.retry_delays, self.max_attempts)

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if (
            self.transactional
            and self.prefetch > TRANSACTIONAL_CONNECTIONS
            and "prefetch" not in self.model_fields_set
        ):
            # Left at its default: transactional mode's own is what its pool holds.
            self.prefetch = TRANSACTIONAL_CONNECTIONS
        problem = contradiction(self)
        if problem:
            raise ValueError(problem)
        return self

    def as_env(self) -> dict[str, str]:
        """The ``SEMEL_*`` variables that load exactly these settings in another process."""
        env: dict[str, str] = {}
        for field, value in self.model_dump(mode="json").items():
            if value is None:
                continue
            text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
            env[f"{PREFIX}{field.upper()}"] = text
        return env
