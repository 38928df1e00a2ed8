"""The report's ratios, on made-up figures: no broker, no timing."""

from __future__ import annotations

import pytest

from bench.report import CaseResult, Results, faststream_table


def case(name: str, consumer: str, store: str | None, keys: str, rate: float) -> CaseResult:
    return CaseResult(name, consumer, store, keys, 1, 100, [rate], [100.0])


def test_the_middleware_is_compared_with_bare_faststream_and_the_worker() -> None:
    middleware = case("faststream+semel-redis-unique", "faststream+semel", "redis", "unique", 300)
    middleware.faststream_target = 0.7
    cluster = case(
        "faststream+semel-redis-cluster-unique", "faststream+semel", "redis-cluster", "unique", 150
    )
    worker_cluster = case("semel-redis-cluster-unique", "semel", "redis-cluster", "unique", 480)
    results = Results(
        meta={"concurrency": {"semel": "up to 256"}},
        cases=[
            case("baseline (bare aio-pika)", "baseline", None, "unique", 1000),
            case("faststream (bare)", "faststream", None, "unique", 500),
            case("semel-redis-unique", "semel", "redis", "unique", 600),
            middleware,
            worker_cluster,
            cluster,
        ],
        long_runs={},
        powertools=None,
    )
    results.finish()
    assert middleware.ratio == pytest.approx(0.3)  # over the aio-pika baseline
    assert middleware.ratio_to_faststream == pytest.approx(0.6)
    assert middleware.ratio_to_worker == pytest.approx(0.5)
    assert middleware.met_vs_faststream is False
    # Cluster cases are compared with one Redis server through the same consumer.
    assert cluster.ratio_to_redis == pytest.approx(0.5)
    assert worker_cluster.ratio_to_redis == pytest.approx(0.8)
    assert cluster.ratio_to_worker == pytest.approx(150 / 480)
    assert faststream_table(results) is not None


def test_no_faststream_table_without_the_front() -> None:
    results = Results(
        meta={},
        cases=[case("baseline (bare aio-pika)", "baseline", None, "unique", 1000)],
        long_runs={},
        powertools=None,
    )
    results.finish()
    assert faststream_table(results) is None
