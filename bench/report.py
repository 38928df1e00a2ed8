"""The benchmark's results: one table on the terminal, the same as JSON, and a bar chart.

Only ratios measured in the same run are compared with the targets; the
absolute figures depend on the machine and on whatever else it runs.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

# Messages/s as a ratio to the bare consumer, per (store, keys).
RATIO_TARGETS = {
    ("redis", "unique"): 0.6,
    ("redis", "duplicates"): 0.8,
    ("postgres", "unique"): 0.4,
    ("sqlite", "unique"): 0.4,
}
P99_TARGETS_MS = {"redis": 5.0, "postgres": 10.0}  # delivery to ACK at light load
# Messages/s as a ratio to semel on one Redis server in the same run, per (store, keys).
REDIS_RATIO_TARGETS = {("redis-cluster", "unique"): 0.8, ("redis-cluster", "duplicates"): 0.8}
REDIS = "redis"  # the store the Redis Cluster cases are compared with
# The FastStream front: a bare subscriber, and the same one behind semel's middleware.
FASTSTREAM_BARE = "faststream"
FASTSTREAM_SEMEL = "faststream+semel"
# The middleware's messages/s over the bare FastStream subscriber's, per (store, keys).
FASTSTREAM_TARGETS = {("redis", "unique"): 0.7, ("redis", "duplicates"): 0.7}
RSS_GROWTH_LIMIT = 0.02  # from the second batch of the long run to the third (see LongRun)
POWERTOOLS_TARGET = 3.0  # semel's DynamoDB messages/s over Powertools' calls/s


@dataclass
class CaseResult:
    """Drain throughput of one case over the repeats."""

    case: str
    consumer: str  # "baseline", "semel", "faststream" or "faststream+semel"
    store: str | None
    keys: str  # "unique" or "duplicates"
    processes: int
    messages: int
    rates: list[float]
    cpu_us_per_message: list[float]  # the consumers' CPU time (user + system) per message
    target: float | None = None
    revision: str | None = None  # another revision's commit (--against); None: this checkout
    messages_per_s: float = field(init=False)
    cpu_us: float = field(init=False)
    ratio: float | None = None
    # Each repeat's msg/s over the baseline's of the same repeat, and their median.
    ratios: list[float] = field(default_factory=list)
    ratio_median: float | None = None
    # Redis Cluster cases: over semel on one Redis server (same keys and processes).
    ratio_to_redis: float | None = None
    redis_target: float | None = None
    # The middleware's cases: over the bare FastStream subscriber, with its target,
    # and over semel's worker on the same store and keys.
    ratio_to_faststream: float | None = None
    faststream_target: float | None = None
    ratio_to_worker: float | None = None

    def __post_init__(self) -> None:
        self.messages_per_s = statistics.median(self.rates)
        self.cpu_us = statistics.median(self.cpu_us_per_message)

    @property
    def met(self) -> bool | None:
        return None if self.target is None or self.ratio is None else self.ratio >= self.target

    @property
    def met_vs_redis(self) -> bool | None:
        if self.redis_target is None or self.ratio_to_redis is None:
            return None
        return self.ratio_to_redis >= self.redis_target

    @property
    def met_vs_faststream(self) -> bool | None:
        if self.faststream_target is None or self.ratio_to_faststream is None:
            return None
        return self.ratio_to_faststream >= self.faststream_target


@dataclass
class Results:
    meta: dict[str, Any]
    cases: list[CaseResult]
    long_runs: dict[str, dict[str, Any]]  # consumer kind -> LongRun as a dict, plus verdicts
    powertools: dict[str, Any] | None

    def finish(self) -> None:
        """Ratios against the baseline of the same run, and every target's verdict."""
        bare = next(c for c in self.cases if c.consumer == "baseline")
        for case in self.cases:
            case.ratio = case.messages_per_s / bare.messages_per_s
            if len(case.rates) == len(bare.rates):  # one drain of each per repeat
                case.ratios = [rate / b for rate, b in zip(case.rates, bare.rates, strict=True)]
                case.ratio_median = statistics.median(case.ratios)
        for case in self.cases:
            if case.store is None or not case.store.startswith(f"{REDIS}-"):
                continue
            same = [
                c.messages_per_s
                for c in self.cases
                if (c.consumer, c.store, c.keys, c.processes, c.revision)
                == (case.consumer, REDIS, case.keys, case.processes, case.revision)
            ]
            if same:
                case.ratio_to_redis = case.messages_per_s / same[0]
                case.redis_target = REDIS_RATIO_TARGETS.get((case.store, case.keys))
        self._faststream_ratios()
        for kind, run in self.long_runs.items():
            run["rss_growth"] = run["rss_third_mb"] / run["rss_second_mb"] - 1
            run["rss_flat"] = run["rss_growth"] <= RSS_GROWTH_LIMIT
            target = P99_TARGETS_MS.get(kind)
            to_ack = run.get("delivery_to_ack")
            run["p99_target_ms"] = target
            run["p99_met"] = None if target is None or not to_ack else to_ack["p99_ms"] < target
        if self.powertools is not None:
            semel = next(
                c.messages_per_s
                for c in self.cases
                if (c.consumer, c.store, c.keys, c.revision)
                == ("semel", "dynamodb", "unique", None)
            )
            pt = self.powertools
            pt["semel_messages_per_s"] = semel
            pt["powertools_calls_per_s"] = statistics.median(pt["powertools_rates"])
            pt["ratio"] = semel / pt["powertools_calls_per_s"]
            pt["target"] = POWERTOOLS_TARGET
            pt["met"] = pt["ratio"] >= POWERTOOLS_TARGET
            # semel's store alone, by requests in flight: claim + complete pairs/s,
            # and the CPU per pair of the client (semel) and of the server.
            for prefix, name in (
                ("store_rates_", "semel_store_pairs_per_s"),
                ("store_client_us_", "semel_store_client_us_per_pair"),
                ("store_server_us_", "server_us_per_pair"),
            ):
                pt[name] = {
                    key.removeprefix(prefix): statistics.median(values)
                    for key, values in list(pt.items())
                    if key.startswith(prefix)
                }

    def _faststream_ratios(self) -> None:
        """The middleware over the bare FastStream subscriber and over semel's worker."""
        bare = [c.messages_per_s for c in self.cases if c.consumer == FASTSTREAM_BARE]
        for case in self.cases:
            if case.consumer != FASTSTREAM_SEMEL:
                continue
            if bare:
                case.ratio_to_faststream = case.messages_per_s / bare[0]
            worker = [
                c.messages_per_s
                for c in self.cases
                if (c.consumer, c.store, c.keys, c.processes, c.revision)
                == ("semel", case.store, case.keys, case.processes, None)
            ]
            if worker:
                case.ratio_to_worker = case.messages_per_s / worker[0]

    def as_json(self) -> bytes:
        cases = [
            asdict(c)
            | {
                "met": c.met,
                "met_vs_redis": c.met_vs_redis,
                "met_vs_faststream": c.met_vs_faststream,
            }
            for c in self.cases
        ]
        data: dict[str, Any] = {"meta": self.meta, "cases": cases, "long_runs": self.long_runs}
        data["powertools"] = self.powertools
        return orjson.dumps(data, option=orjson.OPT_INDENT_2)


def _verdict(met: bool | None) -> str:
    return "" if met is None else (" [green]ok[/]" if met else " [red]missed[/]")


def _to_redis(case: CaseResult) -> str:
    """A Redis Cluster case over one Redis server, with its target."""
    if case.ratio_to_redis is None:
        return ""
    text = f"{case.ratio_to_redis:.2f}"
    if case.redis_target is not None:
        text += f" (≥ {case.redis_target:g}{_verdict(case.met_vs_redis)})"
    return text


def _latency(run: dict[str, Any] | None, key: str) -> str:
    figure = None if run is None else run.get(key)
    if not figure:
        return "-"
    return f"{figure['p50_ms']:.2f} / {figure['p99_ms']:.2f}"


def _rss(run: dict[str, Any] | None) -> str:
    if run is None:
        return "-"
    growth = f"{run['rss_growth']:+.1%}"
    flat = growth if run["rss_flat"] else f"[red]{growth}[/]"
    figures = (run["rss_first_mb"], run["rss_second_mb"], run["rss_third_mb"])
    return " → ".join(f"{mb:.0f}" for mb in figures) + f" ({flat})"


def table(results: Results) -> Table:
    grid = Table(title="semel benchmark (median of repeats; ratios against the bare consumer)")
    grid.add_column("case", no_wrap=True)
    for column in ("msg/s", "ratio", "target", "÷ redis", "CPU µs/msg"):
        grid.add_column(column, justify="right", no_wrap=True)
    grid.add_column("delivery→ACK p50/p99 ms", justify="right")
    grid.add_column("publish→handler p50/p99 ms", justify="right")
    grid.add_column("RSS MB, batch 1 → 2 → 3 (2 → 3)", justify="right")
    for case in results.cases:
        kind = case.store or "baseline"
        # The long runs are the aio-pika baseline's and the worker's only.
        first_row = case.consumer in ("baseline", "semel")
        first_row = first_row and case.keys == "unique" and case.processes == 1
        first_row = first_row and case.revision is None
        run = results.long_runs.get(kind) if first_row else None
        p99 = "" if run is None else _verdict(run.get("p99_met"))
        grid.add_row(
            case.case,
            f"{case.messages_per_s:,.0f}",
            f"{case.ratio:.2f}" if case.ratio is not None else "-",
            ("≥ " + f"{case.target:g}" + _verdict(case.met)) if case.target else "",
            _to_redis(case),
            f"{case.cpu_us:,.0f}",
            _latency(run, "delivery_to_ack") + p99,
            _latency(run, "publish_to_handler"),
            _rss(run),
        )
    pt = results.powertools
    if pt is not None:
        grid.add_section()
        grid.add_row("powertools dynamodb (calls/s)", f"{pt['powertools_calls_per_s']:,.0f}")
        client, server = pt["semel_store_client_us_per_pair"], pt["server_us_per_pair"]
        for in_flight, pairs in pt["semel_store_pairs_per_s"].items():
            grid.add_row(
                f"semel store alone, {in_flight} in flight (pairs/s; CPU µs per pair)",
                f"{pairs:,.0f}", "", "", "", f"{client[in_flight]:,.0f}",
            )  # fmt: skip
            if in_flight in server:
                grid.add_row(
                    f"  the server's CPU per pair, {in_flight} in flight", "", "", "", "",
                    f"{server[in_flight]:,.0f}",
                )  # fmt: skip
        grid.add_row(
            "semel dynamodb end to end ÷ powertools",
            f"{pt['semel_messages_per_s']:,.0f}",
            f"{pt['ratio']:.2f}x",
            f"≥ {pt['target']:g}x" + _verdict(pt["met"]),
        )
    return grid


def faststream_table(results: Results) -> Table | None:
    """The FastStream front's ratios, and what each consumer ran at once; ``None`` if
    the run did not measure it."""
    cases = [c for c in results.cases if c.consumer in (FASTSTREAM_BARE, FASTSTREAM_SEMEL)]
    if not cases:
        return None
    grid = Table(
        title="FastStream front (median of repeats)",
        caption="\n".join(
            f"{name}: {said}" for name, said in results.meta.get("concurrency", {}).items()
        ),
        caption_justify="left",
    )
    grid.add_column("case", no_wrap=True)
    for column in ("msg/s", "÷ bare FastStream", "target", "÷ semel worker", "÷ aio-pika"):
        grid.add_column(column, justify="right", no_wrap=True)
    grid.add_column("CPU µs/msg", justify="right", no_wrap=True)
    for case in cases:
        over_bare = "1.00" if case.consumer == FASTSTREAM_BARE else "-"
        if case.ratio_to_faststream is not None:
            over_bare = f"{case.ratio_to_faststream:.2f}"
        target = ""
        if case.faststream_target is not None:
            target = f"≥ {case.faststream_target:g}{_verdict(case.met_vs_faststream)}"
        grid.add_row(
            case.case,
            f"{case.messages_per_s:,.0f}",
            over_bare,
            target,
            "-" if case.ratio_to_worker is None else f"{case.ratio_to_worker:.2f}",
            "-" if case.ratio is None else f"{case.ratio:.2f}",
            f"{case.cpu_us:,.0f}",
        )
    return grid


def _figures(values: list[float], form: str) -> str:
    return " ".join(format(value, form) for value in values)


def revisions_table(results: Results) -> Table | None:
    """With --against: each case on every revision, repeat by repeat; ``None`` otherwise."""
    against = results.meta.get("against")
    if not against:
        return None
    checkout = against["checkout"]
    ours = checkout["sha"][:7] + (" + changes to semel/" if checkout["dirty"] else "")
    names = {r["sha"]: f"{r['ref']} ({r['sha'][:7]})" for r in against["revisions"]}
    grid = Table(
        title=f"this checkout ({ours}) against {', '.join(names.values())}",
        caption="ratio: a drain's msg/s over the bare baseline's in the same repeat; "
        "÷ this checkout: that revision's msg/s (and CPU µs/msg) over this "
        "checkout's, repeat by repeat",
        caption_justify="left",
    )
    grid.add_column("case", no_wrap=True)
    grid.add_column("revision", no_wrap=True)
    for column in ("ratio, median", "ratio per repeat", "CPU µs/msg", "CPU µs/msg per repeat"):
        grid.add_column(column, justify="right", no_wrap=True)
    for case in results.cases:
        if case.consumer != "semel" or case.revision is not None:
            continue
        _revision_row(grid, case, case.case, ours)
        for sha, name in names.items():
            twin = (sha, case.store, case.keys, case.processes)
            for other in results.cases:
                if (other.revision, other.store, other.keys, other.processes) == twin:
                    _revision_row(grid, other, "", name)
                    _over_row(grid, other, case)
        grid.add_section()
    return grid


def _revision_row(grid: Table, case: CaseResult, title: str, revision: str) -> None:
    grid.add_row(
        title,
        revision,
        "-" if case.ratio_median is None else f"{case.ratio_median:.3f}",
        _figures(case.ratios, ".3f"),
        f"{case.cpu_us:,.0f}",
        _figures(case.cpu_us_per_message, ",.0f"),
    )


def _over_row(grid: Table, other: CaseResult, case: CaseResult) -> None:
    """``other``'s msg/s and CPU per message over ``case``'s, repeat by repeat."""
    over = [o / c for o, c in zip(other.rates, case.rates, strict=True)]
    cpu = [o / c for o, c in zip(other.cpu_us_per_message, case.cpu_us_per_message, strict=True)]
    grid.add_row(
        "",
        "  ÷ this checkout",
        f"{statistics.median(over):.3f}",
        _figures(over, ".3f"),
        f"{statistics.median(cpu):.3f}",
        _figures(cpu, ".3f"),
    )


def chart(results: Results, path: Path) -> None:
    """Bars of each semel case's ratio, with its target as a line across the bar; the
    FastStream middleware's over the bare subscriber, when measured."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    cases = [c for c in results.cases if c.consumer == "semel"]
    pt = results.powertools
    front = [c for c in results.cases if c.ratio_to_faststream is not None]
    widths = [max(len(cases), 1)] + ([1] if pt else []) + ([len(front)] if front else [])
    fig, axes = plt.subplots(
        1,
        len(widths),
        figsize=(max(7.0, 3 + 1.1 * sum(widths)), 5),
        width_ratios=widths,
        squeeze=False,
    )
    ax = axes[0][0]
    labels = [c.case.removeprefix("semel-") for c in cases]
    bars = ax.bar(range(len(cases)), [c.ratio or 0 for c in cases], color="#4c72b0")
    ax.bar_label(bars, fmt="%.2f", padding=2)
    for x, case in enumerate(cases):
        if case.target is not None:
            ax.hlines(case.target, x - 0.45, x + 0.45, colors="#c44e52", linewidth=2.5)
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xticks(range(len(cases)), labels, rotation=30, ha="right")
    ax.set_ylabel("messages/s ÷ bare aio-pika consumer")
    ax.set_title("semel ÷ bare consumer (red: target)")
    if pt:
        right = axes[0][1]
        bar = right.bar([0], [pt["ratio"]], color="#55a868")
        right.bar_label(bar, fmt="%.2f", padding=2)
        right.hlines(pt["target"], -0.45, 0.45, colors="#c44e52", linewidth=2.5)
        right.set_xticks([0], ["dynamodb"])
        right.set_ylabel("semel msg/s ÷ Powertools calls/s")
        right.set_title("vs Powertools")
    if front:
        last = axes[0][-1]
        bars = last.bar(
            range(len(front)), [c.ratio_to_faststream or 0 for c in front], color="#8172b2"
        )
        last.bar_label(bars, fmt="%.2f", padding=2)
        for x, case in enumerate(front):
            if case.faststream_target is not None:
                last.hlines(case.faststream_target, x - 0.45, x + 0.45, colors="#c44e52", lw=2.5)
        last.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        labels = [c.case.removeprefix("faststream+semel-") for c in front]
        last.set_xticks(range(len(front)), labels, rotation=30, ha="right")
        last.set_ylabel("messages/s ÷ bare FastStream subscriber")
        last.set_title("middleware ÷ bare FastStream")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def publish(results: Results, out: Path, console: Console) -> None:
    """Print the table, write results.json and chart.png into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    console.print(table(results))
    for extra in (faststream_table(results), revisions_table(results)):
        if extra is not None:
            console.print(extra)
    (out / "results.json").write_bytes(results.as_json())
    chart(results, out / "chart.png")
    console.print(f"wrote {out / 'results.json'} and {out / 'chart.png'}")
