"""The chaos run's result table: one row per figure, one column per store."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from rich.table import Table

from tests.chaos.run import Report
from tests.chaos.verdict import KILLED, OUTAGE, UNEXPLAINED


def _dead_lettered(report: Report) -> str:
    reasons = report.verdict.dead_lettered
    listed = ", ".join(f"{reason} {count}" for reason, count in reasons.items())
    total = sum(reasons.values())
    return f"{total} ({listed})" if listed else "0"


def _sent(report: Report) -> str:
    sent = report.sent
    duplicates = sent.total - sent.originals
    share = duplicates / sent.total if sent.total else 0.0
    return f"{sent.total} ({duplicates} duplicates, {share:.0%})"


def _copies(report: Report) -> str:
    sent = report.sent
    text = f"{sent.concurrent_copies} concurrent, {sent.late_copies} late"
    if sent.late_before_done:
        text += f", {sent.late_before_done} late before completion"
    if sent.resends:
        text += f"; {sent.resends} resent"
    return text


def _effects(report: Report) -> str:
    text = f"{report.executions} / {report.effects}"
    rolled_back = report.attempted - report.effects
    return f"{text} ({rolled_back} more rolled back)" if rolled_back else text


def _kills(report: Report) -> str:
    return f"{report.kills} ({report.kills_after_effect} aimed after the effect)"


def _restarts(report: Report) -> str:
    if not report.exits:
        return str(report.restarts)
    return f"{report.restarts} ({report.exits} after exiting by themselves)"


def _outages(report: Report) -> str:
    return f"{report.outages}: {report.outage_kind}" if report.outages else report.outage_kind


def _outage_duplicates(report: Report) -> str:
    found = [d for d in report.verdict.duplicates if d.cause == OUTAGE]
    returned = sum(1 for d in found if d.returned)
    return f"{len(found)} ({returned} after the handler returned)" if found else "0"


def _verdict(report: Report) -> str:
    if report.ok:
        return "PASS"
    why = []
    if not report.drained:
        why.append("drain deadline missed")
    if report.verdict.lost:
        why.append("keys lost")
    if report.verdict.count(UNEXPLAINED):
        why.append("unexplained duplicates")
    elif report.verdict.strict and report.verdict.duplicates:
        why.append("duplicate effects in transactional mode")
    return "FAIL: " + ", ".join(why)


ROWS: list[tuple[str, Callable[[Report], object]]] = [
    ("messages sent", _sent),
    ("  copies (concurrent, late; resent)", _copies),
    ("distinct keys", lambda r: r.verdict.keys),
    ("workers SIGKILLed mid-handler", _kills),
    ("worker restarts", _restarts),
    ("broker restarts", lambda r: r.broker_restarts),
    ("store outages", _outages),
    ("  completions held through it", lambda r: r.held if r.outages else "-"),
    ("handler executions / effects", _effects),
    ("keys completed (store)", lambda r: r.verdict.completed),
    ("keys in Q.dlq (by reason)", _dead_lettered),
    ("lost", lambda r: len(r.verdict.lost)),
    ("duplicate effects: explained by a kill", lambda r: r.verdict.count(KILLED)),
    ("duplicate effects: lease expired in outage", _outage_duplicates),
    ("duplicate effects: unexplained", lambda r: r.verdict.count(UNEXPLAINED)),
    ("left in work/retry queues", lambda r: r.left_in_queues),
    ("wall time", lambda r: f"{r.wall:.1f} s"),
    ("verdict", _verdict),
]  # fmt: skip


def render(reports: list[Report]) -> Table:
    table = Table(title="semel chaos run", show_lines=False)
    table.add_column("figure")
    for report in reports:
        table.add_column(report.store, overflow="fold")
    for label, value in ROWS:
        table.add_row(label, *(str(value(report)) for report in reports))
    return table


def evidence(report: Report, limit: int = 20, examples: int = 3) -> list[str]:
    """Each lost key and unexplained duplicate (up to ``limit``), a few examples of the rest."""
    lines = [f"{report.store}: lost {key}" for key in report.verdict.lost[:limit]]
    shown: Counter[str] = Counter()
    for dup in report.verdict.duplicates:
        cap = limit if dup.cause == UNEXPLAINED else examples
        if dup.cause != KILLED and shown[dup.cause] < cap:
            shown[dup.cause] += 1
            lines.append(f"{report.store}: {dup.cause} {dup.key} fence {dup.fence}: {dup.evidence}")
    return lines
