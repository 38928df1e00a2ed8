"""The outbox benchmark's results: two tables on the terminal and the same as JSON.

Speeds are compared only within the run: the relays' messages/s over the
direct confirmed publishes' of the same run (medians of the repeats), with
the CPU every process kind spent per message beside them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from bench.outbox.throughput import Rate

BASELINE = "direct"  # the throughput case every ratio divides by
HERE = "in-process"  # engine.relay() in the benchmark's own process


@dataclass
class Results:
    meta: dict[str, Any]
    latency: list[dict[str, Any]] = field(default_factory=list)
    direct_latency: dict[str, Any] | None = None
    staging_per_s: list[float] = field(default_factory=list)
    # case name ("direct", "relays-1", "relays-2") -> one Rate per repeat
    throughput: dict[str, list[Rate]] = field(default_factory=dict)

    def median(self, case: str) -> float:
        return statistics.median(rate.per_second for rate in self.throughput[case])

    def ratio(self, case: str) -> float:
        return self.median(case) / self.median(BASELINE)

    def as_json(self) -> bytes:
        cases = {
            name: {
                "runs": [rate.as_dict() for rate in rates],
                "messages_per_s": self.median(name),
                "ratio": self.ratio(name),
                "cpu_us_per_message": _median_cpu(rates),
            }
            for name, rates in self.throughput.items()
        }
        data = {
            "meta": self.meta,
            "latency": self.latency,
            "direct_latency": self.direct_latency,
            "staging_per_s": self.staging_per_s,
            "throughput": cases,
        }
        return orjson.dumps(data, option=orjson.OPT_INDENT_2)


def _median_cpu(rates: list[Rate]) -> dict[str, float]:
    return {
        kind: statistics.median(rate.cpu_us[kind] for rate in rates) for kind in rates[0].cpu_us
    }


def _figures(figure: dict[str, Any] | None) -> list[str]:
    if not figure:
        return ["-"] * 4
    return [f"{figure[k]:,.1f}" for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")]


def latency_table(results: Results) -> Table:
    rate = results.meta["rate"]
    grid = Table(
        title=f"Publish latency at {rate:g} messages/s, one transaction per message (ms)",
        caption="commit: right after the client's COMMIT returned; confirmed: the broker's "
        "confirm reached the relay; delivered: a consumer of the queue got it",
        caption_justify="left",
    )
    grid.add_column("case", no_wrap=True)
    grid.add_column("from → to", no_wrap=True)
    for column in ("p50", "p95", "p99", "max", "relay CPU µs/msg"):
        grid.add_column(column, justify="right", no_wrap=True)
    for run in results.latency:
        case = "relay, LISTEN/NOTIFY" if run["listen"] else "relay, sweep only"
        cpu = f"{run['relay_cpu_us_per_message']:,.0f}"
        grid.add_row(case, "commit → confirmed", *_figures(run.get("commit_to_confirmed")), cpu)
        grid.add_row("", "commit → delivered", *_figures(run["commit_to_delivered"]), "")
    if results.direct_latency is not None:
        figure = results.direct_latency["publish_to_confirmed"]
        grid.add_row("publish_confirmed, no outbox", "publish → confirmed", *_figures(figure), "")
    return grid


CASE_NAMES = {
    BASELINE: "publish_confirmed, a relay batch at a time (this process)",
    HERE: "1 relay: engine.relay() in this process",
}


def throughput_table(results: Results) -> Table:
    repeat = results.meta["repeat"]
    grid = Table(
        title=f"Relay throughput, {results.meta['messages']:,} staged rows "
        f"(median of {repeat}; ratio to publish_confirmed in the same run)",
        caption=f"staging beforehand: {statistics.median(results.staging_per_s):,.0f} "
        f"stage() calls/s, {results.meta['stage_batch']} per transaction"
        if results.staging_per_s
        else None,
        caption_justify="left",
    )
    grid.add_column("case", no_wrap=True)
    for column in ("msg/s", "ratio", "client CPU µs/msg", "PostgreSQL", "RabbitMQ", "cores busy"):
        grid.add_column(column, justify="right", no_wrap=True)
    for name, rates in results.throughput.items():
        cpu = _median_cpu(rates)
        busy = statistics.median(rate.machine_busy for rate in rates)
        relays = name.removeprefix("relays-")
        plural = "relays" if relays != "1" else "relay"
        label = CASE_NAMES.get(name, f"{relays} {plural}: a child process each")
        grid.add_row(
            label,
            f"{results.median(name):,.0f}",
            f"{results.ratio(name):.2f}",
            f"{cpu['client']:,.0f}",
            f"{cpu['postgres']:,.0f}",
            f"{cpu['rabbitmq']:,.0f}",
            f"{busy:.0%}",
        )
    return grid


def publish(results: Results, out: Path, console: Console) -> Path:
    """Print both tables, write ``outbox.json`` into ``out``; returns its path."""
    meta = results.meta
    console.print(f"[bold]{meta['command']}[/]  {meta['date']}")
    console.print(
        f"load average {meta['load_before'][0]:.2f} before, {meta['load_after'][0]:.2f} after; "
        f"{meta['cpus']} cores"
    )
    if results.latency:
        console.print(latency_table(results))
    if results.throughput:
        console.print(throughput_table(results))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "outbox.json"
    path.write_bytes(results.as_json())
    console.print(f"wrote {path}")
    return path
