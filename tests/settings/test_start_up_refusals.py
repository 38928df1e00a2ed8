"""``semel consume`` refuses settings that contradict each other: one line, exit 2.

Each case runs the real entry point in a process of its own, with nothing
but its environment, and stops before any message could be taken.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import ROOT
from tests.settings.blocked_import import UNINSTALLED_ENV

pytestmark = pytest.mark.timeout(60)

EXAMPLE = "semel.consumer.examples:order_paid"
SECRET = "n0t-the-passw0rd"


SEMEL = str(Path(sys.executable).with_name("semel"))  # the installed script


def semel_consume(
    tmp_path: Path, env: dict[str, str], module: str | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SEMEL_")}
    base |= {
        "SEMEL_STORE": "sqlite",
        "SEMEL_SQLITE_PATH": str(tmp_path / "semel.db"),
        "SEMEL_METRICS_PORT": "0",
        "SEMEL_HANDLER": EXAMPLE,
        "SEMEL_BROKER_GIVE_UP": "5",
    }
    environment = {k: v for k, v in (base | env).items() if v}  # "" unsets a variable
    return subprocess.run(
        [SEMEL, "consume"] if module is None else [sys.executable, "-m", module, "consume"],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=45,
        check=False,
    )


def refused_with(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("semel: error: "), line
    for word in words:
        assert word in line, line
    return line


def test_a_missing_handler_is_refused(tmp_path: Path) -> None:
    # A default handler would ACK production messages with the example's answer.
    refused_with(semel_consume(tmp_path, {"SEMEL_HANDLER": ""}), "SEMEL_HANDLER", "not set")


def test_more_attempts_than_claims_is_refused(tmp_path: Path) -> None:
    # Every attempt takes a claim: attempt 4 would find 3 claims spent, a poison letter.
    proc = semel_consume(tmp_path, {"SEMEL_MAX_ATTEMPTS": "4", "SEMEL_MAX_CLAIMS": "3"})
    refused_with(proc, "SEMEL_MAX_ATTEMPTS", "SEMEL_MAX_CLAIMS")


def test_retention_shorter_than_the_real_retry_chain_is_refused(tmp_path: Path) -> None:
    # Delays 1,5 with 5 attempts wait 1 + 5 + 5 + 5 = 16 s: the last tier repeats.
    # The plain sum (6 s) would let a 10 s retention through.
    env = {"SEMEL_RETRY_DELAYS": "1,5", "SEMEL_MAX_ATTEMPTS": "5", "SEMEL_RETENTION": "10"}
    env |= {"SEMEL_LOCK_TTL": "3"}
    refused_with(semel_consume(tmp_path, env), "SEMEL_RETENTION", "16s", "SEMEL_MAX_ATTEMPTS")


def test_transactional_prefetch_beyond_its_connections_is_refused(tmp_path: Path) -> None:
    env = {
        "SEMEL_STORE": "postgres",
        "SEMEL_TRANSACTIONAL": "true",
        "SEMEL_POSTGRES_DSN": "postgresql://127.0.0.1:5432/test",
        "SEMEL_PREFETCH": "100",
        "SEMEL_HANDLER": "tests.transactional.handlers:record_order",
    }
    refused_with(semel_consume(tmp_path, env), "SEMEL_PREFETCH", "SEMEL_TRANSACTIONAL", "32")


def test_a_store_without_its_extra_names_the_install_command(tmp_path: Path) -> None:
    env = {
        "SEMEL_STORE": "postgres",
        "SEMEL_POSTGRES_DSN": "postgresql://127.0.0.1:5432/test",
        UNINSTALLED_ENV: "psycopg,psycopg_pool",
    }
    proc = semel_consume(tmp_path, env, module="tests.settings.blocked_import")
    refused_with(proc, "SEMEL_STORE=postgres", "pip install 'semel[postgres]'")


def test_a_broker_that_refuses_the_login_is_a_configuration_error(tmp_path: Path) -> None:
    env = {"SEMEL_AMQP_URL": f"amqp://guest:{SECRET}@127.0.0.1:5672/"}
    proc = semel_consume(tmp_path, env)
    line = refused_with(proc, "broker refused the login")
    assert SECRET not in proc.stderr + proc.stdout, line
