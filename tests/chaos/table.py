"""The chaos run's result tables.

Classic runs (kills, broker restart, outage): one row per figure, one column
per store. Runs of the other fault kinds: one row per store and fault, its
figures in columns, so each fault's lost keys and duplicate effects (with no
crash in the run) read across one line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from rich.table import Table

from tests.chaos.faults import CLASSIC
from tests.chaos.run import Report
from tests.chaos.verdict import KILLED, OUTAGE, UNEXPLAINED, UNREPLICATED
from tests.chaos.workers import WORKER


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


def _failovers(report: Report) -> str:
    """When the primary died, in the executions' span, and how long the promotion took."""
    if not report.failovers:
        return "-"
    first, last = report.flow
    return "; ".join(
        f"at {f.killed - first:.1f} s of {last - first:.1f} s, "
        f"promoted {f.promoted - f.killed:.1f} s later"
        for f in report.failovers
    )


def _overlaps(report: Report) -> str:
    if not report.overlaps_claim_lost:
        return str(report.overlaps)
    return f"{report.overlaps} ({report.overlaps_claim_lost} after a claim lost at failover)"


def _verdict(report: Report) -> str:
    if report.ok:
        return "PASS"
    why = []
    if not report.drained:
        why.append("drain deadline missed")
    if report.verdict.lost:
        why.append("keys lost")
    if report.verdict.parked:
        why.append("keys parked in Q.dlq")
    if report.verdict.count(UNEXPLAINED):
        why.append("unexplained duplicates")
    if report.verdict.replicated and report.verdict.count(UNREPLICATED):
        why.append("writes lost at failover though replicas acknowledged them")
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
    ("  primary killed (failover)", _failovers),
    ("handler executions / effects", _effects),
    ("keys completed (store)", lambda r: r.verdict.completed),
    ("keys in Q.dlq (by reason)", _dead_lettered),
    ("  of them parked (meant to complete)", lambda r: len(r.verdict.parked)),
    ("lost", lambda r: len(r.verdict.lost)),
    ("duplicate effects: explained by a kill", lambda r: r.verdict.count(KILLED)),
    ("duplicate effects: lease expired in outage", _outage_duplicates),
    ("duplicate effects: unreplicated at failover", lambda r: r.verdict.count(UNREPLICATED)),
    ("duplicate effects: unexplained", lambda r: r.verdict.count(UNEXPLAINED)),
    ("executions of one key at the same time", _overlaps),
    ("left in work/retry queues", lambda r: r.left_in_queues),
    ("wall time", lambda r: f"{r.wall:.1f} s"),
    ("verdict", _verdict),
]  # fmt: skip


def _title(title: str, reports: list[Report]) -> str:
    """``title``, and the front door when the workers were not semel's own."""
    fronts = sorted({r.front for r in reports} - {WORKER})
    return f"{title} (front door: {', '.join(fronts)})" if fronts else title


def render(reports: list[Report]) -> Table:
    table = Table(title=_title("semel chaos run", reports), show_lines=False)
    table.add_column("figure")
    for report in reports:
        table.add_column(report.label, overflow="fold")
    for label, value in ROWS:
        table.add_row(label, *(str(value(report)) for report in reports))
    return table


FAULT_COLUMNS: list[tuple[str, Callable[[Report], object]]] = [
    ("store", lambda r: r.store),
    ("fault", lambda r: r.fault),
    ("sent", lambda r: r.sent.total),
    ("kills/terms", lambda r: f"{r.kills}/{r.terms}"),
    ("runs/effects", lambda r: f"{r.executions}/{r.effects}"),
    ("held", lambda r: r.held if r.outages else "-"),
    ("slowest", lambda r: f"{r.slowest:.1f} s"),
    ("Q.dlq", lambda r: sum(r.verdict.dead_lettered.values())),
    ("parked", lambda r: len(r.verdict.parked)),
    ("lost", lambda r: len(r.verdict.lost)),
    ("dup.", lambda r: len(r.verdict.duplicates)),
    ("killed", lambda r: r.verdict.count(KILLED)),
    ("in fault", lambda r: r.verdict.count(OUTAGE)),
    ("unexpl.", lambda r: r.verdict.count(UNEXPLAINED)),
    ("overlaps", lambda r: r.overlaps),
    ("left", lambda r: r.left_in_queues),
    ("wall", lambda r: f"{r.wall:.0f} s"),
    ("verdict", _verdict),
]  # fmt: skip


def render_faults(reports: list[Report]) -> Table:
    """One row per run of a fault kind other than classic (only ``rolling`` stops workers)."""
    # What each fault did goes under the table, a line per run: too long for a cell.
    legend = (
        "kills/terms: workers SIGKILLed / SIGTERMed mid-handler; "
        "slowest: longest delivery, arrival to settle; parked: in Q.dlq though meant to "
        "complete; dup.: duplicate (superseded) effects; killed: of them, SIGKILLed after "
        "the effect; "
        "in fault: of them, lease expired while the store was away from their worker; "
        "unexpl.: of them, unexplained; overlaps: pairs of executions of one key at the same "
        "time, with or without an effect"
    )
    caption = "\n".join([legend, *(f"{r.store} {r.fault}: {r.fault_detail}" for r in reports)])
    table = Table(
        title=_title("semel chaos run: store faults and rolling restarts", reports),
        caption=caption,
        caption_justify="left",
        show_lines=False,
    )
    for label, _ in FAULT_COLUMNS:
        # Figures stay on one line; the verdict and long headers may wrap.
        table.add_column(label, overflow="fold", no_wrap=label != "verdict")
    for report in reports:
        table.add_row(*(str(value(report)) for _, value in FAULT_COLUMNS))
    return table


def tables(reports: list[Report]) -> list[Table]:
    """The classic table and the faults table, each when there is a run for it."""
    classic = [r for r in reports if r.fault == CLASSIC]
    others = [r for r in reports if r.fault != CLASSIC]
    return ([render(classic)] if classic else []) + ([render_faults(others)] if others else [])


def evidence(report: Report, limit: int = 20, examples: int = 3) -> list[str]:
    """Each lost key and unexplained duplicate (up to ``limit``), a few examples of the rest."""
    name = report.label if report.fault == CLASSIC else f"{report.label} {report.fault}"
    lines = [f"{name}: lost {key}" for key in report.verdict.lost[:limit]]
    lines += [f"{name}: parked in Q.dlq {key}" for key in report.verdict.parked[:examples]]
    shown: Counter[str] = Counter()
    for dup in report.verdict.duplicates:
        cap = limit if dup.cause == UNEXPLAINED else examples
        if dup.cause != KILLED and shown[dup.cause] < cap:
            shown[dup.cause] += 1
            lines.append(f"{name}: {dup.cause} {dup.key} fence {dup.fence}: {dup.evidence}")
    return lines
