"""``Semel``'s settings, given in code or read from the environment, and the package's
public names."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import semel
from semel.consumer.errors import ConfigurationError
from semel.consumer.ops.collector import FIRST_GENERATION_THRESHOLD
from semel.settings import Settings

pytestmark = pytest.mark.timeout(30)


def test_settings_in_code_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMEL_STORE", "postgres")
    monkeypatch.setenv("SEMEL_QUEUE", "from.env")
    assert semel.Semel().settings.queue == "from.env"
    engine = semel.Semel(store="redis", redis_url="redis://cache:6379/0")
    assert (engine.settings.store.value, engine.settings.queue) == ("redis", "from.env")
    given = Settings(store="sqlite", queue="from.code")
    assert semel.Semel(given).settings.queue == "from.code"
    assert semel.Semel(given, queue="over").settings.queue == "over"


def test_a_bad_setting_in_code_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"^SEMEL_STORE: "):
        semel.Semel(store="nope")
    with pytest.raises(ConfigurationError, match="SEMEL_LOCK_TTL"):
        semel.Semel(Settings(), lock_ttl=-1)
    with pytest.raises(ConfigurationError, match=r"^SEMEL_TRANSACTIONAL: "):
        semel.Semel(store="postgres", transactional=True)


def test_import_semel_stays_light() -> None:
    """The front doors' names come on first use: a worker or a command imports
    none of FastStream, aio-pika or a store's client for them."""
    code = (
        "import sys, semel\n"
        "assert not {'aio_pika', 'faststream', 'redis', 'psycopg'} & set(sys.modules)\n"
        "assert semel.Semel.__name__ == 'Semel' and semel.Settings.__name__ == 'Settings'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_tune_gc_freezes_start_up_and_collects_the_young_generation_less_often() -> None:
    """What an app with a front door calls once started (a process of its own: the
    test process's collector is left alone)."""
    script = (
        "import gc, json, semel\n"
        "before = gc.get_threshold()\n"
        "semel.tune_gc()\n"
        "print(json.dumps([before, gc.get_threshold(), gc.get_freeze_count()]))\n"
    )
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True)
    before, after, frozen = json.loads(shown.stdout)
    assert before[0] == 700  # CPython's default, for the comparison
    assert after == [FIRST_GENERATION_THRESHOLD, before[1], before[2]]
    assert frozen > 0


async def test_a_decorated_function_runs_once_in_the_engines_store(redis_server: str) -> None:
    """``engine.idempotent``: the engine's store, and one of its own retention for a
    function whose completed keys expire sooner."""
    import uuid

    engine = semel.Semel(store="redis", redis_url=redis_server, key_prefix=uuid.uuid4().hex)
    runs: list[str] = []

    @engine.idempotent(key="order_id", scope="charge")
    async def charge(order_id: str) -> int:
        runs.append(order_id)
        return len(runs)

    @engine.idempotent(key="order_id", scope="remind", expires_after=5)
    async def remind(order_id: str) -> int:
        runs.append(f"remind {order_id}")
        return len(runs)

    async with engine:
        assert [await charge("o-1"), await charge("o-1"), await remind("o-1")] == [1, 1, 2]
        assert await remind("o-1") == 2
        kept = await (await engine.store_for(None)).get("charge:o-1")
        brief = await (await engine.store_for(5)).get("remind:o-1")
    assert runs == ["o-1", "remind o-1"]
    assert kept is not None
    assert brief is not None
    assert kept.expires_at is not None
    assert brief.expires_at is not None
    assert (kept.expires_at - brief.expires_at).total_seconds() > 3600  # a day against 5 s
