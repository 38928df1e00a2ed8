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
from bench.profiles import summarise
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
        assert run["rss_third_mb"] > 0
        assert run["publish_to_handler"]["p99_ms"] > 0
        assert run["delivery_to_ack"]["p99_ms"] > 0
    assert (out / "chart.png").stat().st_size > 0
    assert "semel-redis-unique" in done.stdout  # the table was printed
    assert leftover_queues(results["meta"]["run_id"]) == []


FASTSTREAM_CASES = {
    "baseline (bare aio-pika)",
    "faststream (bare)",
    "semel-redis-unique",
    "semel-redis-duplicates",
    "faststream+semel-redis-unique",
    "faststream+semel-redis-duplicates",
    "semel-redis-unique-2procs",
}


@pytest.mark.timeout(240)
def test_the_faststream_front_is_measured_beside_the_worker(
    tmp_path: Path, rabbitmq_server: str, redis_server: str
) -> None:
    out, profiles = tmp_path / "out", tmp_path / "profiles"
    argv = [sys.executable, "-m", "bench", "--quick", "--stores", "redis", "--front", "faststream"]
    argv += ["--messages", "300", "--rss-messages", "200", "--profile", str(profiles)]
    done = subprocess.run(
        [*argv, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=230
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    results: dict[str, Any] = orjson.loads((out / "results.json").read_bytes())
    cases = {case["case"]: case for case in results["cases"]}
    assert set(cases) == FASTSTREAM_CASES
    for name, case in cases.items():
        assert case["messages_per_s"] > 0, name
        assert case["cpu_us"] > 0, name
    for keys in ("unique", "duplicates"):
        middleware = cases[f"faststream+semel-redis-{keys}"]
        assert middleware["consumer"] == "faststream+semel"
        assert middleware["ratio"] > 0  # over the aio-pika baseline, as every case
        assert middleware["ratio_to_faststream"] > 0
        assert middleware["ratio_to_worker"] > 0
        assert middleware["faststream_target"] == 0.7
    assert cases["faststream (bare)"]["ratio_to_faststream"] is None
    assert cases["semel-redis-unique"]["ratio_to_worker"] is None
    # The long runs stay the aio-pika baseline's and the worker's.
    assert set(results["long_runs"]) == {"baseline", "redis"}
    assert set(results["meta"]["concurrency"]) == {
        "baseline (bare aio-pika)",
        "semel",
        "faststream",
    }
    assert "FastStream front" in done.stdout
    # One profile per FastStream drain: bare, then the middleware's two.
    assert len(list(profiles.glob("*.prof"))) == 3
    [middleware_unique] = profiles.glob("*faststream-redis.unique*.prof")
    assert "semel.consumer.embedded" in summarise(middleware_unique, messages=300, top=40)
    assert leftover_queues(results["meta"]["run_id"]) == []


@pytest.mark.timeout(60)
def test_powertools_comparison_runs_on_moto(moto_endpoint: str) -> None:
    seconds = measure(moto_endpoint, "powertools_smoke", "smoke", calls=5)
    assert seconds > 0
