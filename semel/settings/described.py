"""What each setting means: the configuration page is generated from these and
from :class:`~semel.settings.model.Settings` (its names and defaults), so the two
cannot drift: a test fails when a field has no meaning here, or a meaning no field."""

from __future__ import annotations

# What the page shows as the default where the value alone would mislead.
DEFAULT_NOTES: dict[str, str] = {
    "prefetch": "`256` (`32` in transactional mode)",
    "dynamodb_endpoint_url": "unset (AWS)",
    "handler": "required",
    "dlq_archive_retention": "`14d`",
    "management_url": (
        "unset (`semel queues`: the first `SEMEL_AMQP_URL` host, port 15672, "
        "same credentials and vhost)"
    ),
}

MEANINGS: dict[str, str] = {
    "store": ("`sqlite`, `postgres`, `redis` or `dynamodb`"),
    "amqp_url": (
        "broker; `amqps://` works too. A cluster's nodes as one URL with several hosts "
        "(`amqp://u:p@rabbit-1,rabbit-2,rabbit-3/vhost`) or URLs separated by commas (see "
        "[Running against a RabbitMQ cluster]"
        "(clusters.md#running-against-a-rabbitmq-cluster)). "
        "Heartbeat 10 s unless the URL sets "
        "`?heartbeat=`. Falls back to `AMQP_URL` / `CLOUDAMQP_URL`"
    ),
    "postgres_dsn": ("falls back to `DATABASE_URL`; `?sslmode=` is passed through"),
    "redis_url": (
        "falls back to `REDIS_URL`; one server, `redis+sentinel://` or `redis+cluster://` (see "
        "[Redis: one server, Sentinel or Cluster]"
        "(stores.md#redis-one-server-sentinel-or-cluster)); "
        "`rediss` for TLS"
    ),
    "redis_replicas_ack": (
        "Redis: replicas each write waits for (`WAIT`) before it counts as stored, 0 to 16"
    ),
    "postgres_table": ("table of the PostgreSQL and SQLite stores"),
    "transactional": (
        "PostgreSQL only: run the handler, its completion and its outgoing messages in one "
        "transaction (see [Transactional mode](transactional.md))"
    ),
    "outbox_table": (
        "the outbox table: transactional handlers and any application transaction stage "
        "messages in it (see [The outbox](outbox.md))"
    ),
    "outbox_relay": (
        "run the outbox relay in `semel consume` too (always on in transactional mode)"
    ),
    "outbox_listen": (
        "relays wake on PostgreSQL `LISTEN/NOTIFY` after each commit; off: sweep only"
    ),
    "outbox_ordering": (
        "`oldest-first` (per batch; per key while one relay runs) or `per-key` (a key's next "
        "message waits until its previous one is confirmed, across relays)"
    ),
    "outbox_stale_after": ("seconds: unsent outbox messages older than this show in `/readyz`"),
    "dynamodb_table": ("the DynamoDB store's table"),
    "dynamodb_endpoint_url": ("e.g. a local DynamoDB; `AWS_ENDPOINT_URL_DYNAMODB` also honoured"),
    "dynamodb_region": ("falls back to `AWS_REGION` / `AWS_DEFAULT_REGION`"),
    "dynamodb_client": (
        "`lean`: the per-message calls go through semel's own HTTP/1.1 client (about a fifth of "
        "botocore's CPU); `botocore`: every call through boto3, as `semel migrate` always does. "
        "An endpoint reached through `HTTP(S)_PROXY` uses botocore either way"
    ),
    "sqlite_path": ("the SQLite store's database file"),
    "handler": (
        "`package.module:callable`, or `package.module:app` for an app of several handlers (see "
        "[Several handlers: an app](handlers.md#several-handlers-an-app)); "
        "`semel consume TARGET` sets it too. No default: `semel "
        "consume` refuses to start without it (exit 2), so a deployment that forgot it never "
        "acknowledges real messages with the bundled example "
        "(`semel.consumer.examples:order_paid`, which `make consume` names)"
    ),
    "app_dir": (
        "the folder `SEMEL_HANDLER` is imported from, first on the import path (uvicorn's "
        "`--app-dir`): by default the one `semel consume` is started in; `semel consume "
        "--app-dir DIR` sets it too"
    ),
    "exchange": ("topic exchange that producers publish to"),
    "queue": (
        "the work queue; every other name derives from it. An app's handlers each get "
        "`<SEMEL_QUEUE>.<name>`"
    ),
    "binding_keys": (
        "comma-separated routing keys bound to the queue (one handler; an app's handlers bring "
        "their own)"
    ),
    "queue_type": ("`quorum` or `classic`"),
    "key_source": ("or `message_id`, or `body:<dotted.path>`"),
    "key_prefix": (
        "namespace of every key in the store, so services sharing a store never collide"
    ),
    "max_body_bytes": ("larger bodies are dead-lettered as `too-large`"),
    "prefetch": (
        "deliveries in flight per process, all processed concurrently. Transactional mode runs "
        "each handler on a connection of its own, at most 32: a larger prefetch is refused "
        "there"
    ),
    "lock_ttl": ("how long a claim lives without a heartbeat"),
    "retention": (
        "how long a completed key is remembered; at least the lock TTL and the whole retry "
        "chain: the `SEMEL_MAX_ATTEMPTS - 1` waits between attempts, the last delay repeating "
        "(`1,5,30,120` with 5 attempts: 156 s)"
    ),
    "retry_delays": ("back-off tiers for failed handlers; the last one repeats"),
    "max_attempts": (
        "handler attempts before the DLQ; at most `SEMEL_MAX_CLAIMS` (each attempt claims the "
        "key once)"
    ),
    "conflict_delay": ("how long an in-progress conflict waits before it is tried again"),
    "max_claims": ("claims of one key without completion before it is treated as poison"),
    "completed_cache_size": (
        "keys each worker process remembers as completed (its own completions, and keys a "
        "claim found completed), so that a copy with the same key and body is ACKed as a "
        "duplicate without asking the store; about 400 bytes each with 40-character keys "
        "(100,000: about 40 MB); `0` turns it off. Never a failed key (a replay runs it "
        "again). A record deleted by hand or lost by the store is still a duplicate here for "
        "up to `SEMEL_COMPLETED_CACHE_TTL`"
    ),
    "completed_cache_ttl": (
        "how long a key stays in that cache at most; never past its retention in the store "
        "less 60 s"
    ),
    "handler_timeout": ("a handler running longer is cancelled and counts as a failed attempt"),
    "shutdown_grace": (
        "on SIGTERM, how long handlers in flight may finish before their claims are released (a"
        " plain `def` handler's thread gets 5 s more, and its key is never released while it "
        "runs)"
    ),
    "broker_give_up": (
        "exit 1 (for the supervisor to restart) when the broker stays away this long"
    ),
    "dlq_archive_retention": (
        "how long an archived dead letter stays in the DLQ, from when it was archived "
        "(`semel dlq archive`); then the broker drops it. Seconds, or a number with a unit: "
        "`90m`, `2h`, `3d`, `1w`; at most `3650d` (the broker refuses a longer message expiration)"
    ),
    "metrics_port": ("Prometheus metrics and health endpoints; `0` turns it off"),
    "management_url": (
        "the RabbitMQ management API (`http(s)://user:password@host:port/vhost`). `semel "
        "queues` reads it; `semel consume` asks it every 30 s for `semel_queue_messages_dlx` "
        "only when it is set"
    ),
    "log_format": ("`console` or `json`"),
    "log_level": (
        "`debug`, `info`, `warning` or `error`, for semel's lines and the handler's own "
        "(`logging` or structlog); routine deliveries (completed, duplicate) are logged at "
        "`debug`, counted every 5 s at `info` (see [Logs](operations.md#logs))"
    ),
}
