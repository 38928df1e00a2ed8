"""The outbox benchmark still runs end to end: ``python -m bench.outbox``, tiny.

Only that every figure was measured and everything it made was removed:
speed depends on the machine and is never asserted here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.servers import ROOT

pytestmark = pytest.mark.slow

RATE, SECONDS, ROWS = 50, 0.6, 600


def leftover_queues(run_id: str) -> list[str]:
    names = subprocess.run(
        ["rabbitmqctl", "list_queues", "name", "-q"], capture_output=True, text=True, check=True
    ).stdout.split()
    return [name for name in names if run_id in name]


def leftover_tables(dsn: str, run_id: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE %s", (f"%{run_id}%",)
        ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.timeout(180)
def test_a_tiny_run_measures_latency_both_ways_and_throughput(
    tmp_path: Path, postgres_server: str, rabbitmq_server: str
) -> None:
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "bench.outbox", "--rate", str(RATE), "--seconds", str(SECONDS)]
    argv += ["--messages", str(ROWS), "--repeat", "1", "--relays", "1,2", "--out", str(out)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    results: dict[str, Any] = orjson.loads((out / "outbox.json").read_bytes())
    measured = round(RATE * SECONDS)
    assert [run["listen"] for run in results["latency"]] == [True, False]
    for run in results["latency"]:
        for figure in ("commit_to_confirmed", "commit_to_delivered"):
            assert run[figure]["count"] == measured, (run["listen"], figure)
            assert 0 < run[figure]["p50_ms"] <= run[figure]["p99_ms"] <= run[figure]["max_ms"]
    assert results["direct_latency"]["publish_to_confirmed"]["count"] == measured
    cases = results["throughput"]
    assert set(cases) == {"direct", "in-process", "relays-1", "relays-2"}
    for name, case in cases.items():
        assert case["messages_per_s"] > 0, name
        assert case["ratio"] > 0, name
        assert case["cpu_us_per_message"]["client"] > 0, name
    assert cases["direct"]["ratio"] == 1.0
    assert "Relay throughput" in done.stdout
    assert "Publish latency" in done.stdout
    run_id = results["meta"]["run_id"]
    assert leftover_queues(run_id) == []
    assert leftover_tables(postgres_server, run_id) == []
