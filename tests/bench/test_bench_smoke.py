"""The benchmark still runs end to end: ``python -m bench --quick`` on the local servers.

Only that every case produced positive figures and the files were written:
speed depends on the machine and is never asserted here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.powertools import measure
from tests.servers import ROOT

pytestmark = pytest.mark.slow

STORES = ["sqlite", "redis", "redis-cluster"]
CASES = {
    "baseline (bare aio-pika)",
    "semel-sqlite-unique",
    "semel-sqlite-duplicates",
    "semel-redis-unique",
    "semel-redis-duplicates",
    "semel-redis-unique-2procs",
    "semel-redis-cluster-unique",
    "semel-redis-cluster-duplicates",
}


def leftover_queues(run_id: str) -> list[str]:
    names = subprocess.run(
        ["rabbitmqctl", "list_queues", "name", "-q"], capture_output=True, text=True, check=True
    ).stdout.split()
    return [name for name in names if name.startswith(f"bench.{run_id}.")]


@pytest.mark.timeout(240)
def test_quick_run_measures_every_case(
    tmp_path: Path, rabbitmq_server: str, redis_server: str
) -> None:
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "bench", "--quick", "--stores", ",".join(STORES)]
    done = subprocess.run(
        [*argv, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=230
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    results: dict[str, Any] = orjson.loads((out / "results.json").read_bytes())
    cases = {case["case"]: case for case in results["cases"]}
    assert set(cases) == CASES
    for case in cases.values():
        assert case["messages_per_s"] > 0
        assert case["ratio"] > 0
        assert len(case["rates"]) == results["meta"]["repeat"]
    # The cluster is compared with one Redis server of the same run, too.
    for keys in ("unique", "duplicates"):
        cluster = cases[f"semel-redis-cluster-{keys}"]
        assert cluster["ratio_to_redis"] > 0
        assert cluster["redis_target"] == 0.8
    assert cases["semel-redis-unique"]["ratio_to_redis"] is None
    assert set(results["long_runs"]) == {"baseline", *STORES}
    for run in results["long_runs"].values():
        assert run["rss_first_mb"] > 0
        assert run["rss_second_mb"] > 0
        assert run["publish_to_handler"]["p99_ms"] > 0
        assert run["delivery_to_ack"]["p99_ms"] > 0
    assert (out / "chart.png").stat().st_size > 0
    assert "semel-redis-unique" in done.stdout  # the table was printed
    assert leftover_queues(results["meta"]["run_id"]) == []


@pytest.mark.timeout(60)
def test_powertools_comparison_runs_on_moto(moto_endpoint: str) -> None:
    seconds = measure(moto_endpoint, "powertools_smoke", "smoke", calls=5)
    assert seconds > 0
