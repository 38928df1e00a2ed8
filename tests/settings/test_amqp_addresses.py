"""``SEMEL_AMQP_URL`` with the addresses of a cluster: both forms, and one line for a bad one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from semel.settings import ConfigError, load_settings, redact
from semel.settings.amqp import amqp_addresses

pytestmark = pytest.mark.timeout(30)

SECRET = "hunter2-s3cr3t"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SEMEL_") or name in {"AMQP_URL", "CLOUDAMQP_URL"}:
            monkeypatch.delenv(name)


def test_one_address_is_one_address() -> None:
    assert load_settings().amqp_addresses == ("amqp://guest:guest@localhost:5672/",)


def test_one_url_with_several_hosts_shares_credentials_vhost_and_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "SEMEL_AMQP_URL", "amqp://app:pw@mq-1:5672,mq-2, mq-3:5673/orders?heartbeat=5"
    )
    assert load_settings().amqp_addresses == (
        "amqp://app:pw@mq-1:5672/orders?heartbeat=5",
        "amqp://app:pw@mq-2/orders?heartbeat=5",
        "amqp://app:pw@mq-3:5673/orders?heartbeat=5",
    )


def test_a_comma_separated_list_of_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDAMQP_URL", "amqps://app:pw@mq-1/orders , amqps://app:pw@mq-2/orders")
    assert load_settings().amqp_addresses == (
        "amqps://app:pw@mq-1/orders",
        "amqps://app:pw@mq-2/orders",
    )


def test_a_comma_in_a_password_splits_nothing() -> None:
    # RFC 3986 allows a comma unencoded in the user information.
    assert amqp_addresses("amqp://app:p,w@mq-1,mq-2/") == (
        "amqp://app:p,w@mq-1/",
        "amqp://app:p,w@mq-2/",
    )
    assert amqp_addresses("amqp://app:p,amqp@mq-1/") == ("amqp://app:p,amqp@mq-1/",)


def test_an_address_listed_twice_counts_once() -> None:
    assert amqp_addresses("amqp://mq-1,mq-2,mq-1/") == ("amqp://mq-1/", "amqp://mq-2/")


def test_the_default_vhost_written_two_ways_is_one_vhost() -> None:
    assert len(amqp_addresses("amqp://mq-1/,amqp://mq-2/%2F,amqp://mq-3")) == 3


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        (f"amqp://app:{SECRET}@mq-1,/orders", "address 2 of 2: URL has no host"),
        (f"amqp://app:{SECRET}@mq-1,mq-2:99999/orders", "address 2 of 2: not a parsable URL"),
        (f"amqp://app:{SECRET}@mq-1/a,amqp://app:{SECRET}@mq-2/b", "different virtual hosts"),
        (f"amqp://app:{SECRET}@mq-1/,http://app:{SECRET}@mq-2/", "address 2 of 2: scheme must"),
        (f"http://app:{SECRET}@mq-1,mq-2/", "scheme must be one of amqp://, amqps://"),
        (" , ", "scheme must be one of"),
    ],
)
def test_a_bad_address_is_one_line_naming_the_variable_never_the_password(
    monkeypatch: pytest.MonkeyPatch, value: str, complaint: str
) -> None:
    monkeypatch.setenv("SEMEL_AMQP_URL", value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert message.startswith("SEMEL_AMQP_URL"), message
    assert complaint in message, message
    assert "\n" not in message
    assert SECRET not in message + repr(info.value)


def test_the_consumer_refuses_a_bad_address_at_start_up_with_exit_2() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEMEL_")}
    env["SEMEL_AMQP_URL"] = f"amqp://app:{SECRET}@mq-1,mq-2:notaport/"
    env["SEMEL_METRICS_PORT"] = "0"
    proc = subprocess.run(
        [sys.executable, "-m", "semel"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == ["semel: error: SEMEL_AMQP_URL (or AMQP_URL / CLOUDAMQP_URL): address 2 of 2: "
                     "not a parsable URL"], proc.stderr  # fmt: skip
    assert SECRET not in proc.stderr + proc.stdout


@pytest.mark.parametrize(
    "text",
    [
        f"amqp://app:{SECRET}@mq-1,mq-2/orders",
        f"amqp://app:{SECRET}@mq-1/orders,amqp://app:{SECRET}@mq-2/orders",
    ],
)
def test_redact_masks_the_password_of_every_address(text: str) -> None:
    assert SECRET not in redact(text)
