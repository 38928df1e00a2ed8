"""Latency probes: what the consumers write while the latency phase runs, and reading it back.

Probe messages carry their monotonic publish time (``CLOCK_MONOTONIC`` is one
clock for every process of the machine) in a header. The consumer under test
appends one line per probe to the file named by ``BENCH_PROBE_FILE``:

    <publish-to-handler ns> <delivery-to-ack ns, or - when it cannot tell>

semel's handler sees a probe after the claim but before the completion and
the ACK, so it can only write the first figure; semel's own ``settled`` log
line carries the second (``duration_ms``, from its pipeline's start to the
ACK), read by :func:`settled_durations` while that line is logged.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import IO

import orjson

PROBE_FILE_ENV = "BENCH_PROBE_FILE"
SENT_HEADER = "x-bench-sent-ns"  # a probe's monotonic publish time, in ns
NO_FIGURE = "-"


class ProbeLog:
    """Appends probe lines; a no-op when the environment names no file."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._file: IO[str] | None = None

    @classmethod
    def from_env(cls) -> ProbeLog:
        return cls(os.environ.get(PROBE_FILE_ENV))

    def write(self, publish_to_handler_ns: int, delivery_to_ack_ns: int | None = None) -> None:
        if self._path is None:
            return
        if self._file is None:
            # Line-buffered: a consumer stopped by SIGTERM has written every probe it saw.
            self._file = open(self._path, "a", buffering=1, encoding="ascii")  # noqa: SIM115
        second = NO_FIGURE if delivery_to_ack_ns is None else str(delivery_to_ack_ns)
        self._file.write(f"{publish_to_handler_ns} {second}\n")


def read_probes(path: Path) -> tuple[list[float], list[float]]:
    """Publish-to-handler and delivery-to-ACK figures of a probe file, in milliseconds."""
    to_handler: list[float] = []
    to_ack: list[float] = []
    if not path.exists():
        return to_handler, to_ack
    for line in path.read_text(encoding="ascii").splitlines():
        first, second = line.split()
        to_handler.append(int(first) / 1e6)
        if second != NO_FIGURE:
            to_ack.append(int(second) / 1e6)
    return to_handler, to_ack


def settled_durations(log: Path, key_prefix: str) -> list[float]:
    """``duration_ms`` of semel's JSON ``settled`` lines for keys starting with ``key_prefix``."""
    needle = key_prefix.encode()  # cheap filter; the parsed line says whether it is the key
    durations: list[float] = []
    with log.open("rb") as lines:
        for line in lines:
            if needle not in line:
                continue
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            key = str(event.get("key", ""))
            if event.get("event") == "settled" and key.startswith(key_prefix):
                durations.append(float(event["duration_ms"]))
    return durations


def percentiles(samples: list[float]) -> tuple[float, float] | None:
    """p50 and p99 (inclusive method), or ``None`` with too few samples to mean anything."""
    if len(samples) < 10:
        return None
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[98]
