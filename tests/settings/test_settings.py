"""Settings: defaults, fallbacks, and one clear line for every bad value."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from semel.settings import ConfigError, Settings, StoreKind, load_settings, redact

pytestmark = pytest.mark.timeout(30)

SECRET = "hunter2-s3cr3t"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SEMEL_") or name in {
            "DATABASE_URL",
            "REDIS_URL",
            "AMQP_URL",
            "CLOUDAMQP_URL",
            "AWS_ENDPOINT_URL_DYNAMODB",
        }:
            monkeypatch.delenv(name)


def test_defaults_match_the_design() -> None:
    s = load_settings()
    assert s.store is StoreKind.SQLITE
    assert s.amqp_url == "amqp://guest:guest@localhost:5672/"
    assert s.postgres_dsn == "postgresql://localhost/postgres"
    assert s.redis_url == "redis://localhost:6379/0"
    assert (s.postgres_table, s.dynamodb_table) == ("semel_keys", "semel_keys")
    assert s.dynamodb_endpoint_url is None
    assert s.sqlite_path == "./semel.db"
    assert (s.exchange, s.queue, s.binding_keys) == ("semel.events", "semel.work", ["#"])
    assert s.queue_type.value == "quorum"
    assert s.key_source == "header:Idempotency-Key"
    assert s.key_prefix == "semel"
    assert s.max_body_bytes == 1_048_576
    assert (s.lock_ttl, s.retention) == (30, 86_400)
    assert s.retry_delays == [1, 5, 30, 120]
    assert (s.max_attempts, s.conflict_delay, s.max_claims) == (5, 5, 10)
    assert (s.handler_timeout, s.metrics_port, s.log_format.value) == (300, 9464, "console")


def test_lists_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMEL_BINDING_KEYS", "order.*, invoice.#")
    monkeypatch.setenv("SEMEL_RETRY_DELAYS", "0.5,2,10")
    s = load_settings()
    assert s.binding_keys == ["order.*", "invoice.#"]
    assert s.retry_delays == [0.5, 2, 10]


@pytest.mark.parametrize(
    ("fallback", "field", "value"),
    [
        ("DATABASE_URL", "postgres_dsn", "postgresql://db.internal/app"),
        ("REDIS_URL", "redis_url", "rediss://cache.internal:6380/1"),
        ("AMQP_URL", "amqp_url", "amqps://mq.internal/vh"),
        ("CLOUDAMQP_URL", "amqp_url", "amqps://cloud.internal/vh"),
        ("AWS_ENDPOINT_URL_DYNAMODB", "dynamodb_endpoint_url", "http://localhost:8000"),
    ],
)
def test_platform_fallbacks(
    monkeypatch: pytest.MonkeyPatch, fallback: str, field: str, value: str
) -> None:
    monkeypatch.setenv(fallback, value)
    assert getattr(load_settings(), field) == value


def test_semel_variable_wins_over_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://fallback/db")
    monkeypatch.setenv("SEMEL_POSTGRES_DSN", "postgresql://primary/db")
    assert load_settings().postgres_dsn == "postgresql://primary/db"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SEMEL_STORE", "mongodb"),
        ("SEMEL_LOCK_TTL", "-5"),
        ("SEMEL_RETENTION", "0"),
        ("SEMEL_RETRY_DELAYS", "1,x,3"),
        ("SEMEL_RETRY_DELAYS", "1,-2"),
        ("SEMEL_PREFETCH", "0"),
        ("SEMEL_MAX_ATTEMPTS", "zero"),
        ("SEMEL_AMQP_URL", "http://localhost/"),
        ("SEMEL_AMQP_URL", "amqp://host:99999999/"),
        ("SEMEL_REDIS_URL", "not a url"),
        ("SEMEL_POSTGRES_TABLE", "drop table; --"),
        ("SEMEL_QUEUE_TYPE", "stream"),
        ("SEMEL_KEY_SOURCE", "cookie:x"),
        ("SEMEL_HANDLER", "no_colon_here"),
        ("SEMEL_LOG_FORMAT", "xml"),
        ("SEMEL_METRICS_PORT", "70000"),
    ],
)
def test_bad_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert message.startswith(variable), message
    assert "\n" not in message


def test_retention_shorter_than_retries_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMEL_RETRY_DELAYS", "60,600")
    monkeypatch.setenv("SEMEL_RETENTION", "100")
    with pytest.raises(ConfigError, match=r"^SEMEL_RETENTION: .*SEMEL_RETRY_DELAYS"):
        load_settings()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SEMEL_POSTGRES_DSN", f"postgresql://app:{SECRET}@db:notaport/app"),
        ("SEMEL_POSTGRES_DSN", f"mysql://app:{SECRET}@db/app"),
        ("DATABASE_URL", f"mysql://app:{SECRET}@db/app"),
        ("SEMEL_AMQP_URL", f"http://app:{SECRET}@mq/"),
        ("SEMEL_REDIS_URL", f"memcached://:{SECRET}@cache/0"),
    ],
)
def test_secret_never_in_the_error(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)


def test_cli_bad_setting_exits_2_with_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEMEL_")}
    env |= {
        "SEMEL_POSTGRES_DSN": f"postgresql://app:{SECRET}@db:bad/app",
        "SEMEL_STORE": "postgres",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "semel.consumer.commands.app", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("semel: error: SEMEL_POSTGRES_DSN")
    assert "Traceback" not in proc.stderr
    assert SECRET not in proc.stderr + proc.stdout


@pytest.mark.parametrize(
    "text",
    [
        f"postgresql://app:{SECRET}@db:5432/app",
        f"amqps://user:{SECRET}@mq.example/vhost",
        f"redis://:{SECRET}@cache:6379/0",
        f"host=db user=app password={SECRET} dbname=app",
        f"connection to postgresql://app:{SECRET}@db/app failed",
    ],
)
def test_redact_masks_passwords(text: str) -> None:
    masked = redact(text)
    assert SECRET not in masked
    assert "***" in masked


def test_redact_leaves_plain_text() -> None:
    assert redact("redis://cache:6379/0") == "redis://cache:6379/0"


def test_settings_construct_from_field_names() -> None:
    s = Settings(store=StoreKind.REDIS, redis_url="redis://localhost:6380/2")
    assert s.store is StoreKind.REDIS


def test_retention_shorter_than_lock_ttl_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMEL_RETRY_DELAYS", "1")
    monkeypatch.setenv("SEMEL_LOCK_TTL", "60")
    monkeypatch.setenv("SEMEL_RETENTION", "30")
    with pytest.raises(ConfigError, match=r"^SEMEL_RETENTION: .*SEMEL_LOCK_TTL"):
        load_settings()


def test_as_env_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Settings(
        store=StoreKind.REDIS,
        binding_keys=["a.*", "b.#"],
        retry_delays=[0.5, 2.0],
        dynamodb_endpoint_url="http://localhost:8000",
    )
    for name, value in original.as_env().items():
        monkeypatch.setenv(name, value)
    assert load_settings() == original


def test_no_handler_is_assumed() -> None:
    assert load_settings().handler is None  # `semel consume` refuses to start without one


@pytest.mark.parametrize(
    ("delays", "attempts", "chain"),
    [([1, 5, 30], 1, 0), ([1, 5, 30], 3, 6), ([1, 5, 30], 6, 96), ([2], 4, 6)],
)
def test_the_retry_chain_repeats_the_last_tier(
    delays: list[float], attempts: int, chain: float
) -> None:
    settings = load_settings(retry_delays=delays, max_attempts=attempts)
    assert settings.retry_chain() == chain


def test_transactional_mode_defaults_its_prefetch_to_its_connections() -> None:
    from semel.settings.model import TRANSACTIONAL_CONNECTIONS
    from semel.stores.postgres.transactional import POOL_MAX

    assert POOL_MAX[1] == TRANSACTIONAL_CONNECTIONS  # one setting per connection of the pool
    settings = load_settings(store="postgres", transactional=True)
    assert settings.prefetch == TRANSACTIONAL_CONNECTIONS
    assert load_settings(store="postgres", transactional=True, prefetch=8).prefetch == 8
    with pytest.raises(ConfigError, match="SEMEL_PREFETCH: 33 is above the 32"):
        load_settings(store="postgres", transactional=True, prefetch=33)
