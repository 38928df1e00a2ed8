"""Security basics: secrets stay out of output, TLS settings reach the clients.

Secrets are checked the way an operator would meet them: the output of a
real ``python -m semel`` or ``semel inspect`` process that failed because
of a wrong password or an unreachable server. TLS is shown to be attempted
by what a plain-TCP listener receives first (a TLS handshake record, or
PostgreSQL's SSLRequest) and by the clients' SSL errors against the local
plain-text servers. Key namespacing is in ``test_key_prefix.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from semel.settings import Settings
from tests.conftest import POSTGRES_DSN, SettingsFactory, open_store, settings_env
from tests.consumer.harness import Broker, ConsumerProcess
from tests.servers import ROOT, free_port

pytestmark = pytest.mark.timeout(60)

SECRET = "Pa55-w0rd-do-not-print"
ENCODED_SECRET = "p%40ss%2Fw0rd%3Ahidden"  # p@ss/w0rd:hidden, URL-encoded
SECRETS = (SECRET, ENCODED_SECRET, "p@ss/w0rd:hidden")
TLS_HANDSHAKE = 0x16  # first byte of a TLS record carrying a ClientHello
PG_SSL_REQUEST = struct.pack("!ii", 8, 80877103)


@pytest.fixture
def make_settings(make_settings: SettingsFactory) -> Iterator[SettingsFactory]:
    """The shared factory, on a queue and exchange of the test's own, removed after it:
    a consumer started here declares its topology before its store fails."""
    queue = f"t.security.{uuid.uuid4().hex[:8]}"
    private = {"queue": queue, "exchange": f"{queue}.events"}
    made: list[Settings] = []

    def factory(**overrides: Any) -> Settings:
        made.append(make_settings(**(private | overrides)))
        return made[-1]

    yield factory
    if made:
        asyncio.run(delete_topology(made[0]))


async def delete_topology(settings: Settings) -> None:
    broker = await Broker.connect(settings.amqp_url)
    try:
        await broker.delete_topology(settings)
    finally:
        await broker.close()


def semel(env: dict[str, str], *args: str, limit: float = 40) -> subprocess.CompletedProcess[str]:
    """``semel ARGS`` as a process; output is stdout and stderr together."""
    return subprocess.run(
        [sys.executable, "-m", "semel.consumer.commands.app", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=limit,
        check=False,
    )


def output(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout + done.stderr


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} leaked:\n{text}"


class PlainTcp:
    """A listener that records the first bytes of each connection and answers in plain text."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port: int = self.sock.getsockname()[1]
        self.first: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    self.first.append(conn.recv(16))
                    conn.sendall(b"-ERR this port speaks plain TCP\r\n")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def plain_tcp() -> Iterator[PlainTcp]:
    server = PlainTcp()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def base_env(make_settings: SettingsFactory) -> dict[str, str]:
    """A consumer that gives up on an absent broker within two seconds."""
    return settings_env(make_settings(broker_give_up=2.0))


@pytest.mark.parametrize("log_format", ["console", "json"])
@pytest.mark.parametrize(
    "url",
    [
        f"amqp://guest:{SECRET}@127.0.0.1:{free_port()}/",  # nothing listens there
        f"amqp://guest:{SECRET}@127.0.0.1:5672/",  # the broker refuses the password
        f"amqp://guest:{ENCODED_SECRET}@127.0.0.1:5672/",
    ],
    ids=["unreachable", "wrong-password", "encoded-password"],
)
def test_the_amqp_password_never_reaches_the_output(
    base_env: dict[str, str], rabbitmq_server: str, url: str, log_format: str
) -> None:
    env = base_env | {"SEMEL_AMQP_URL": url, "SEMEL_LOG_FORMAT": log_format}
    done = subprocess.run(
        [sys.executable, "-m", "semel"], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=40, check=False,
    )  # fmt: skip
    # Nothing listening is worth a restart (1); a refused login is not (2).
    assert done.returncode == (2 if ":5672/" in url else 1)
    assert "semel: error: broker" in done.stderr
    assert_no_secret(output(done))


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://semel:{SECRET}@127.0.0.1:{free_port()}/semel",
        f"postgresql://semel@127.0.0.1:{free_port()}/semel?password={SECRET}",
        f"postgresql://semel:{ENCODED_SECRET}@127.0.0.1:{free_port()}/semel",
    ],
    ids=["userinfo", "query", "encoded"],
)
@pytest.mark.parametrize("command", [[], ["inspect", "some-key"], ["migrate"]])
def test_the_postgres_password_never_reaches_the_output(
    base_env: dict[str, str], dsn: str, command: list[str]
) -> None:
    env = base_env | {"SEMEL_STORE": "postgres", "SEMEL_POSTGRES_DSN": dsn}
    done = semel(env, *command) if command else semel(env, "consume")
    assert done.returncode == 1
    assert "postgres store unavailable" in done.stderr
    assert_no_secret(output(done))


def test_the_redis_password_never_reaches_a_paused_consumers_logs(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    url = f"redis://default:{SECRET}@127.0.0.1:{free_port()}/0"
    settings = make_settings(store="redis", redis_url=url)
    consumer = ConsumerProcess(settings, tmp_path / "consumer.log").start()
    try:
        end = time.monotonic() + 30
        while consumer.output().count("store unreachable") < 3:
            assert consumer.exited() is None, consumer.output()
            assert time.monotonic() < end, consumer.output()
            time.sleep(0.1)
    finally:
        consumer.kill()
    assert_no_secret(consumer.output())
    inspect = semel(settings_env(settings), "inspect", "some-key")
    assert inspect.returncode == 1
    assert_no_secret(output(inspect))


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SEMEL_AMQP_URL", f"amqp://guest:{SECRET}@localhost:99999/"),
        ("SEMEL_POSTGRES_DSN", f"mysql://semel:{SECRET}@localhost/semel"),
        ("SEMEL_REDIS_URL", f"redis://:{SECRET}@localhost:port/0"),
    ],
)
def test_a_rejected_setting_is_named_without_echoing_its_secret(
    base_env: dict[str, str], variable: str, value: str
) -> None:
    for command in (["consume"], ["inspect", "k"]):
        done = semel(base_env | {variable: value}, *command)
        assert done.returncode == 2
        assert variable in done.stderr
        assert_no_secret(output(done))


async def test_inspect_prints_the_record_and_no_secret(
    make_settings: SettingsFactory, postgres_server: str
) -> None:
    # Local connections are trusted: the password is accepted and never needed.
    dsn = POSTGRES_DSN.replace("postgresql://", f"postgresql://postgres:{SECRET}@")
    settings = make_settings(store="postgres", postgres_dsn=dsn)
    store = await open_store(settings)
    try:
        await store.migrate()
        claim = await store.claim("inspected", "f" * 64)
        assert await store.complete("inspected", claim.fence, {"receipt": 7})
    finally:
        await store.close()
    done = semel(settings_env(settings), "inspect", "inspected")
    assert done.returncode == 0, output(done)
    assert '"receipt": 7' in done.stdout
    assert_no_secret(output(done))


def test_amqps_speaks_tls_to_the_broker_port(
    base_env: dict[str, str], rabbitmq_server: str, plain_tcp: PlainTcp
) -> None:
    # The local broker only speaks plain AMQP on 5672: the handshake fails in TLS.
    done = semel(base_env | {"SEMEL_AMQP_URL": "amqps://guest:guest@127.0.0.1:5672/"}, "consume")
    assert done.returncode == 1
    assert "SSL" in done.stderr
    # What a listener receives first is a TLS handshake, not the AMQP protocol header.
    semel(
        base_env | {"SEMEL_AMQP_URL": f"amqps://guest:guest@127.0.0.1:{plain_tcp.port}/"}, "consume"
    )
    assert plain_tcp.first
    assert plain_tcp.first[0][0] == TLS_HANDSHAKE


def test_rediss_speaks_tls(base_env: dict[str, str], plain_tcp: PlainTcp) -> None:
    env = base_env | {"SEMEL_STORE": "redis"}
    done = semel(
        env | {"SEMEL_REDIS_URL": f"rediss://127.0.0.1:{plain_tcp.port}/0"}, "inspect", "k"
    )
    assert done.returncode == 1
    assert "redis store unavailable" in done.stderr
    assert "SSL" in done.stderr
    assert plain_tcp.first
    assert all(first[0] == TLS_HANDSHAKE for first in plain_tcp.first)
    # The same server without the s: plain RESP.
    plain_tcp.first.clear()
    semel(env | {"SEMEL_REDIS_URL": f"redis://127.0.0.1:{plain_tcp.port}/0"}, "inspect", "k")
    assert plain_tcp.first
    assert plain_tcp.first[0][:1] == b"*"


def test_postgres_sslmode_reaches_libpq(
    base_env: dict[str, str], postgres_server: str, plain_tcp: PlainTcp
) -> None:
    env = base_env | {"SEMEL_STORE": "postgres"}
    # The local server has ssl = off: requiring TLS must be refused, not quietly dropped.
    done = semel(env | {"SEMEL_POSTGRES_DSN": f"{POSTGRES_DSN}?sslmode=require"}, "migrate")
    assert done.returncode == 1
    assert "SSL" in done.stderr
    allowed = semel(env | {"SEMEL_POSTGRES_DSN": f"{POSTGRES_DSN}?sslmode=disable"}, "migrate")
    assert allowed.returncode == 0, output(allowed)
    # The first packet on the wire: SSLRequest when required, a startup message when disabled.
    target = f"postgresql://semel@127.0.0.1:{plain_tcp.port}/semel"
    semel(env | {"SEMEL_POSTGRES_DSN": f"{target}?sslmode=require"}, "migrate")
    assert plain_tcp.first[0][:8] == PG_SSL_REQUEST
    plain_tcp.first.clear()
    semel(env | {"SEMEL_POSTGRES_DSN": f"{target}?sslmode=disable"}, "migrate")
    assert plain_tcp.first[0][4:8] == struct.pack("!i", 196608)  # protocol 3.0 startup
