"""The suite's check for redis-py connections left open (tests/redis_connections.py) fails
the test that left one, with where it opened, and not the tests after it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[1]

# The suite's own settings (pyproject.toml), warnings as errors among them.
INI = """
[pytest]
addopts = -p no:cloudcoil -p no:cacheprovider -rE
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
filterwarnings = error
"""

CONFTEST = """
from tests import redis_connections

def pytest_configure(config):
    config.pluginmanager.register(redis_connections.Plugin(), "redis-connections")
"""

LEAKING = """
from redis import Redis as BlockingRedis
from redis.asyncio import Redis

URL = {url!r}
HELD = []


async def opened():
    client = Redis.from_url(URL)
    await client.ping()
    return client


async def test_drops_an_open_client():
    client = await opened()
    client.itself = client  # a cycle: only the garbage collector finds it
    del client


async def test_after_the_dropped_one():
    pass


async def test_keeps_an_open_client():
    HELD.append(await opened())


def test_keeps_an_open_blocking_client():
    client = BlockingRedis.from_url(URL)
    client.ping()
    HELD.append(client)


async def test_closes_its_client():
    client = await opened()
    await client.aclose()
"""


def test_the_test_that_leaves_a_connection_open_fails_with_where_it_opened(
    tmp_path: Path, redis_server: str
) -> None:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_leaking.py").write_text(textwrap.dedent(LEAKING.format(url=redis_server)))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path)],
        cwd=tmp_path,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = done.stdout
    assert "5 passed, 3 errors" in out, out  # a teardown error counts its test passed too
    summary = out[out.index("short test summary info") :]
    for name in (
        "test_drops_an_open_client",
        "test_keeps_an_open_client",
        "test_keeps_an_open_blocking_client",
    ):
        assert f"ERROR test_leaking.py::{name} - " in summary, out
    # Each failure names the line that opened the connection, in its own test.
    assert "line 16, in test_drops_an_open_client" in out, out
    assert "never closed, collected unclosed, opened in" in out, out
    assert "ResourceWarning('unclosed Connection" in out, out
    assert "still open after the test's teardown" in out, out
    assert 'test_leaking.py", line 26, in test_keeps_an_open_client' in out, out
    assert 'test_leaking.py", line 31, in test_keeps_an_open_blocking_client' in out, out
