"""Histograms of the hot path, kept as plain numbers and exposed when scraped.

prometheus-client's ``Histogram.observe`` walks the buckets in Python and takes
a lock for the bucket and another for the sum: about 1.5 µs, and every delivery
makes three observations (the handler, the claim, the completion). A
:class:`Tally` is one bisect and two additions under one lock. A
:class:`TallyHistogram` is registered on the metrics' registry as a collector
and writes the same samples prometheus-client's own histogram would (buckets
with ``le``, ``_count``, ``_sum``, ``_created``), so a scrape cannot tell them
apart.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import cast

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

# How prometheus-client writes a bucket's bound (``0.5``, ``1.0``, ``+Inf``); untyped upstream.
_bound_text = cast(Callable[[float], str], floatToGoString)


class Tally:
    """One series: how many observations fell in each bucket, and their sum."""

    __slots__ = ("_bounds", "_counts", "_lock", "_sum", "created")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self._sum = 0.0
        # Plain handlers are timed on their own threads, the rest on the event loop.
        self._lock = threading.Lock()
        self.created = time.time()

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (le).
        index = bisect_left(self._bounds, value)
        with self._lock:
            self._counts[index] += 1
            self._sum += value

    def read(self) -> tuple[list[int], float]:
        """The count of each bucket (not cumulative) and the sum, as of now."""
        with self._lock:
            return list(self._counts), self._sum


class TallyHistogram:
    """A histogram family of :class:`Tally` series, one per label values."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._bounds = tuple(float(bound) for bound in buckets if bound != math.inf)
        self._le = tuple(_bound_text(bound) for bound in (*self._bounds, math.inf))
        self._series: dict[tuple[str, ...], Tally] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def labels(self, *values: str) -> Tally:
        """The series of these label values, created (at 0) on the first call."""
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name} takes labels {self._labelnames}, got {values}")
        with self._lock:
            tally = self._series.get(values)
            if tally is None:
                tally = self._series[values] = Tally(self._bounds)
            return tally

    def describe(self) -> Iterator[Metric]:
        # Names the family, so the registry refuses a second metric of the same name.
        yield Metric(self._name, self._documentation, "histogram")

    def collect(self) -> Iterator[Metric]:
        metric = Metric(self._name, self._documentation, "histogram")
        with self._lock:
            series = list(self._series.items())
        for values, tally in series:
            labels = dict(zip(self._labelnames, values, strict=True))
            counts, total = tally.read()
            cumulative = 0
            for le, count in zip(self._le, counts, strict=True):
                cumulative += count
                bucket = labels | {"le": le}
                metric.add_sample(f"{self._name}_bucket", bucket, float(cumulative))
            metric.add_sample(f"{self._name}_count", labels, float(cumulative))
            metric.add_sample(f"{self._name}_sum", labels, total)
            metric.add_sample(f"{self._name}_created", labels, tally.created)
        yield metric
