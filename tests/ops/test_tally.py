"""The tallies behind semel's per-delivery histograms scrape exactly like
prometheus-client's own histograms, and lose no observation made from threads."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

from semel.consumer.ops.tally import TallyHistogram

BOUNDS = (0.0005, 0.001, 1, 2.5)
VALUES = (0.0005, 0.0007, 1.0, 3.0, 0.2, 0.0)  # on a bound, between, above every bound, zero


def _without_created(text: str) -> str:
    # _created is the moment the series was made: the one line that differs by nature.
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", text)


def _reference() -> CollectorRegistry:
    registry = CollectorRegistry()
    labelled = Histogram("x_seconds", "help", ["op", "backend"], buckets=BOUNDS, registry=registry)
    plain = Histogram("y_seconds", "other", buckets=(0.005, 10), registry=registry)
    labelled.labels("claim", "redis")  # a series at 0
    for value in VALUES:
        labelled.labels("complete", "redis").observe(value)
        plain.observe(value * 10)
    return registry


def _tallied() -> CollectorRegistry:
    registry = CollectorRegistry()
    labelled = TallyHistogram("x_seconds", "help", ("op", "backend"), BOUNDS, registry)
    plain = TallyHistogram("y_seconds", "other", (), (0.005, 10), registry).labels()
    labelled.labels("claim", "redis")
    for value in VALUES:
        labelled.labels("complete", "redis").observe(value)
        plain.observe(value * 10)
    return registry


@pytest.mark.parametrize("write", [generate_latest, openmetrics], ids=["text", "openmetrics"])
def test_a_tally_scrapes_like_a_prometheus_histogram(
    write: Callable[[CollectorRegistry], bytes],
) -> None:
    expected = _without_created(write(_reference()).decode())
    assert _without_created(write(_tallied()).decode()) == expected


def test_a_name_taken_twice_is_refused() -> None:
    registry = CollectorRegistry()
    TallyHistogram("x_seconds", "help", (), BOUNDS, registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Histogram("x_seconds", "help", registry=registry)


def test_wrong_labels_are_refused() -> None:
    family = TallyHistogram("x_seconds", "help", ("op",), BOUNDS, CollectorRegistry())
    with pytest.raises(ValueError, match="takes labels"):
        family.labels("claim", "redis")


def test_observations_from_threads_are_all_counted() -> None:
    registry = CollectorRegistry()
    tally = TallyHistogram("x_seconds", "help", (), BOUNDS, registry).labels()
    each, threads = 20_000, 4

    def observe() -> None:
        for _ in range(each):
            tally.observe(0.0007)

    workers = [threading.Thread(target=observe) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert registry.get_sample_value("x_seconds_count") == each * threads
    assert registry.get_sample_value("x_seconds_bucket", {"le": "0.001"}) == each * threads
    assert registry.get_sample_value("x_seconds_bucket", {"le": "0.0005"}) == 0
