"""``python -m bench --against REF``: another revision measured beside this checkout.

The cheap tests need no server. The slow ones export and install a commit of
this repository's history into the benchmark's own cache (~/.cache/semel-bench,
or BENCH_REVISION_CACHE): the first run builds its venv (about a minute), later
runs reuse it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from bench.__main__ import parse
from bench.broker import BenchError
from bench.report import CaseResult, Results, revisions_table
from bench.revision import prepare, resolve
from tests.servers import ROOT

# A commit from before semel's modules moved under one ``semel`` package (its
# consumer is ``python -m consumer``): nothing of this checkout can stand in for it.
OLD_LAYOUT = "7a55631"


def test_a_ref_that_names_no_commit_is_refused() -> None:
    with pytest.raises(BenchError, match="--against no-such-ref: not a commit"):
        resolve("no-such-ref")


def test_against_measures_redis_unless_told_otherwise() -> None:
    assert parse(["--against", "HEAD"]).stores == ["redis"]
    assert parse(["--against", "HEAD", "--against", "v1"]).against == ("HEAD", "v1")
    assert len(parse([]).stores) > 1  # without it, every store as before


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--stores", "redis,postgres"], "Redis store only, not postgres"),
        (["--front", "faststream"], "worker only, not --front"),
    ],
)
def test_what_against_cannot_measure_is_refused_in_one_line(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(["--against", "HEAD", *argv])
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


def case(name: str, rates: list[float], revision: str | None = None) -> CaseResult:
    consumer = "baseline" if name.startswith("baseline") else "semel"
    store = None if consumer == "baseline" else "redis"
    cpu = [400.0 + rate / 100 for rate in rates]
    return CaseResult(name, consumer, store, "unique", 1, 100, rates, cpu, revision=revision)


def test_both_revisions_are_reported_repeat_by_repeat() -> None:
    sha = "ab" * 20
    ours = case("semel-redis-unique", [500, 600, 400])
    theirs = case("semel-redis-unique @ababab", [600, 660, 480], sha)
    results = Results(
        meta={
            "against": {
                "checkout": {"sha": "cd" * 20, "dirty": True},
                "revisions": [{"ref": "v1", "sha": sha}],
            }
        },
        cases=[case("baseline (bare aio-pika)", [1000, 1000, 800]), ours, theirs],
        long_runs={},
        powertools=None,
    )
    results.finish()
    assert ours.ratios == pytest.approx([0.5, 0.6, 0.5])
    assert ours.ratio_median == pytest.approx(0.5)
    assert theirs.ratios == pytest.approx([0.6, 0.66, 0.6])
    grid = revisions_table(results)
    assert grid is not None
    assert grid.title == "this checkout (cdcdcdc + changes to semel/) against v1 (abababa)"
    cells = [list(column.cells) for column in grid.columns]
    rows = [[column[row] for column in cells] for row in range(grid.row_count)]
    assert rows[0][1:4] == ["cdcdcdc + changes to semel/", "0.500", "0.500 0.600 0.500"]
    assert rows[1][1:4] == ["v1 (abababa)", "0.600", "0.600 0.660 0.600"]
    assert rows[2][1:4] == ["  ÷ this checkout", "1.200", "1.200 1.100 1.200"]
    assert rows[2][4:] == ["1.002", "1.002 1.001 1.002"]  # CPU µs/msg, made up as 400 + rate/100
    assert "semel-redis-unique @ababab" in results.as_json().decode()


def test_no_revisions_table_without_against() -> None:
    results = Results(
        meta={"against": None},
        cases=[case("baseline (bare aio-pika)", [1000])],
        long_runs={},
        powertools=None,
    )
    results.finish()
    assert revisions_table(results) is None


# Building another revision's venv takes a minute or more and pip's network:
# run by hand (SEMEL_BENCH_REVISION_TESTS=1), not in every CI lane.
needs_builds = pytest.mark.skipif(
    os.environ.get("SEMEL_BENCH_REVISION_TESTS") != "1",
    reason="SEMEL_BENCH_REVISION_TESTS=1 builds and runs another revision",
)


@pytest.mark.slow
@needs_builds
@pytest.mark.timeout(600)  # a first build installs every dependency from pip's cache
def test_a_revision_is_built_once_and_runs_its_own_code() -> None:
    notes: list[str] = []
    revision = prepare(OLD_LAYOUT, note=notes.append)
    assert revision.sha == resolve(OLD_LAYOUT)
    assert revision.home.name == revision.sha
    assert not revision.home.is_relative_to(ROOT)
    assert revision.module == "consumer"
    notes.clear()
    again = prepare(OLD_LAYOUT, note=notes.append)
    assert again == revision
    assert notes == []  # nothing built the second time


def leftover_queues(run_id: str) -> list[str]:
    names = subprocess.run(
        ["rabbitmqctl", "list_queues", "name", "-q"], capture_output=True, text=True, check=True
    ).stdout.split()
    return [name for name in names if name.startswith(f"bench.{run_id}.")]


@pytest.mark.slow
@needs_builds
@pytest.mark.timeout(600)
def test_against_measures_both_revisions_in_one_run(
    tmp_path: Path, rabbitmq_server: str, redis_server: str
) -> None:
    prepare(OLD_LAYOUT)  # built beforehand: the run's own time is what is bounded below
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "bench", "--quick", "--messages", "300", "--repeat", "2"]
    argv += ["--against", OLD_LAYOUT, "--out", str(out)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    results: dict[str, Any] = orjson.loads((out / "results.json").read_bytes())
    [against] = results["meta"]["against"]["revisions"]
    assert against["sha"] == resolve(OLD_LAYOUT)
    assert against["consumer"] == "python -m consumer"
    cases = {c["case"]: c for c in results["cases"]}
    label = against["sha"][:7]
    for keys in ("unique", "duplicates"):
        for name in (f"semel-redis-{keys}", f"semel-redis-{keys} @{label}"):
            assert len(cases[name]["ratios"]) == 2, name
            assert all(ratio > 0 for ratio in cases[name]["ratios"]), name
            assert all(cpu > 0 for cpu in cases[name]["cpu_us_per_message"]), name
        assert cases[f"semel-redis-{keys} @{label}"]["revision"] == against["sha"]
    assert results["long_runs"] == {}
    assert f"against {OLD_LAYOUT} ({label})" in done.stdout
    run_id = results["meta"]["run_id"]
    assert leftover_queues(run_id) == []
    client = redis.Redis.from_url(redis_server)
    assert list(client.scan_iter(match=f"bench-{run_id}-*")) == []
    client.close()
