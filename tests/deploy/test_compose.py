"""deploy/compose.yaml: the compose-spec schema, then what the schema cannot know."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any
from urllib.parse import urlsplit

import pytest

from semel.settings import StoreKind
from tests.deploy.manifests import (
    COMPOSE,
    DEPLOY,
    Document,
    compose,
    default,
    duration_seconds,
    interpolate,
    load_settings_from,
)

pytestmark = pytest.mark.timeout(60)

SEMEL_SERVICES = ("migrate", "consumer", "publisher")
STORES = ("postgres", "redis", "dynamodb")


def service(name: str) -> Document:
    services: dict[str, Document] = compose()["services"]
    assert name in services, f"no service {name!r}"
    return services[name]


def environment(name: str) -> dict[str, str]:
    env: dict[str, Any] = service(name)["environment"]
    assert isinstance(env, dict), "environment as a mapping, so the tests can read it"
    return {key: interpolate(str(value)) for key, value in env.items()}


def test_matches_the_compose_spec_schema() -> None:
    # check-jsonschema ships the compose-spec schema; no network needed.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(COMPOSE),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("name", "image"),
    [
        ("rabbitmq", r"rabbitmq:(3\.13|4\.\d+)(\.\d+)?-management"),
        ("postgres", r"postgres:1[56](\.\d+)?"),
        ("redis", r"redis:7(\.\d+)*"),
        ("dynamodb", r"amazon/dynamodb-local:[\d.]+"),
    ],
)
def test_backing_services_are_pinned_and_health_checked(name: str, image: str) -> None:
    spec = service(name)
    assert re.fullmatch(image, spec["image"]), spec["image"]
    assert spec["healthcheck"]["test"], f"{name} needs a healthcheck for depends_on"


def test_redis_persists_its_keys() -> None:
    command = " ".join(service("redis")["command"])
    assert "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command


def test_semel_services_build_the_deploy_image() -> None:
    for name in SEMEL_SERVICES:
        build = service(name)["build"]
        assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (
            DEPLOY / "Dockerfile"
        ).resolve()


def test_migrate_runs_once_after_every_store_is_healthy() -> None:
    migrate = service("migrate")
    assert migrate["command"] == ["migrate"]
    assert migrate.get("restart", "no") == "no"
    assert {store: dep["condition"] for store, dep in migrate["depends_on"].items()} == {
        store: "service_healthy" for store in STORES
    }


def test_two_consumers_start_after_migrate_succeeded() -> None:
    consumer = service("consumer")
    assert consumer["command"] == ["consume"]
    assert consumer["deploy"]["replicas"] == 2
    assert consumer["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert consumer["depends_on"]["rabbitmq"]["condition"] == "service_healthy"


def test_stop_grace_outlasts_the_handler_timeout() -> None:
    env = environment("consumer")
    timeout = float(env.get("SEMEL_HANDLER_TIMEOUT", default("handler_timeout")))
    grace = float(env.get("SEMEL_SHUTDOWN_GRACE", default("shutdown_grace")))
    assert duration_seconds(service("consumer")["stop_grace_period"]) > timeout + grace


def test_publisher_is_opt_in_and_sends_duplicates() -> None:
    publisher = service("publisher")
    assert "publisher" in publisher["profiles"]
    assert publisher["command"] == ["publish", "--count", "1000", "--duplicates", "0.3"]


def test_every_semel_service_shares_one_environment() -> None:
    envs = [environment(name) for name in SEMEL_SERVICES]
    assert all(env == envs[0] for env in envs)


def test_environment_is_valid_and_defaults_to_postgres(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings_from(environment("consumer"), monkeypatch)
    assert settings.store is StoreKind.POSTGRES


@pytest.mark.parametrize("store", ["postgres", "redis", "dynamodb"])
def test_store_is_selected_by_one_variable(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env = environment("consumer") | {"SEMEL_STORE": store}
    assert load_settings_from(env, monkeypatch).store is StoreKind(store)


def test_urls_point_at_the_compose_services_with_their_credentials() -> None:
    env = environment("consumer")

    amqp = urlsplit(env["SEMEL_AMQP_URL"])
    rabbit = service("rabbitmq")["environment"]
    assert (amqp.hostname, amqp.port) == ("rabbitmq", 5672)
    assert (amqp.username, amqp.password) == (
        rabbit["RABBITMQ_DEFAULT_USER"],
        rabbit["RABBITMQ_DEFAULT_PASS"],
    )

    dsn = urlsplit(env["SEMEL_POSTGRES_DSN"])
    pg = service("postgres")["environment"]
    assert (dsn.hostname, dsn.port) == ("postgres", 5432)
    assert (dsn.username, dsn.password, dsn.path) == (
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
        "/" + pg["POSTGRES_DB"],
    )

    assert urlsplit(env["SEMEL_REDIS_URL"]).hostname == "redis"
    dynamodb = urlsplit(env["SEMEL_DYNAMODB_ENDPOINT_URL"])
    assert (dynamodb.hostname, dynamodb.port) == ("dynamodb", 8000)


def test_metrics_port_is_the_one_the_image_checks() -> None:
    consumer = service("consumer")
    port = int(environment("consumer").get("SEMEL_METRICS_PORT", default("metrics_port")))
    assert [p["target"] for p in consumer["ports"]] == [port]
