"""The cluster runs' tables: one column per fault, and the publisher's proof."""

from __future__ import annotations

from collections.abc import Callable

from rich.table import Table

from tests.chaos.verdict import KILLED, OUTAGE, UNEXPLAINED
from tests.cluster.publish import PublishProof
from tests.cluster.run import ClusterReport


def _sent(report: ClusterReport) -> str:
    sent = report.sent
    copies = sent.total - sent.originals
    text = f"{sent.total} ({copies} duplicates, {copies / max(1, sent.total):.0%})"
    return text + (f"; {sent.resends} publishes resent" if sent.resends else "")


def _placed(report: ClusterReport) -> str:
    nodes = ", ".join(f"{slot}: {node.split(':')[0]}" for slot, node in report.placed.items())
    return f"{nodes} ({report.placement_restarts} restarts to place)"


def _dlq(report: ClusterReport) -> str:
    reasons = report.verdict.dead_lettered
    return f"{sum(reasons.values())} (" + ", ".join(f"{r} {n}" for r, n in reasons.items()) + ")"


def _failovers(report: ClusterReport) -> str:
    found = [f"{slot}: {value:g}" for slot, value in report.failovers.items() if value is not None]
    return f"{sum(v or 0 for v in report.failovers.values()):g} ({', '.join(found)})"


def _cut_off(report: ClusterReport) -> str:
    found = [d for d in report.verdict.duplicates if d.cause == OUTAGE]
    returned = sum(1 for d in found if d.returned)
    return f"{len(found)} ({returned} after the handler returned)" if found else "0"


def _held(report: ClusterReport) -> str:
    if report.held is None:
        return "-"
    held = {name: n for name, n in report.held.items() if n}
    return str(sum(held.values())) + (f" ({held})" if held else "")


def verdict_of(report: ClusterReport) -> str:
    if report.ok:
        return "PASS"
    why = [
        "not drained" if not report.drained else "",
        f"{len(report.verdict.lost)} lost" if report.verdict.lost else "",
        f"{len(report.verdict.parked)} not meant to fail in Q.dlq" if report.verdict.parked else "",
        f"{report.exits} workers exited" if report.exits else "",
        f"{report.overlaps} overlaps" if report.overlaps else "",
        "messages held for dead-lettering" if _held(report) not in ("-", "0") else "",
        f"{report.verdict.count(UNEXPLAINED)} unexplained"
        if report.verdict.count(UNEXPLAINED)
        else "",
    ]
    return "FAIL: " + ", ".join(w for w in why if w)


ROWS: list[tuple[str, Callable[[ClusterReport], str]]] = [
    ("messages sent (duplicates)", _sent),
    ("distinct keys", lambda r: str(r.verdict.keys)),
    ("workers: node before the fault", _placed),
    ("keys completed", lambda r: str(r.verdict.completed)),
    ("keys in Q.dlq (meant to fail)", _dlq),
    ("lost", lambda r: str(len(r.verdict.lost))),
    ("copies parked: key in progress (conflicts)", lambda r: str(r.conflicts)),
    ("workers SIGKILLed (by the run)", lambda r: str(r.worker_kills)),
    (
        "duplicate effects, worker SIGKILLed after the effect",
        lambda r: str(r.verdict.count(KILLED)),
    ),
    ("duplicate effects, lease expired while cut off", _cut_off),
    ("duplicate effects, unexplained", lambda r: str(r.verdict.count(UNEXPLAINED))),
    ("executions of one key at the same time", lambda r: str(r.overlaps)),
    ("failovers (semel_broker_failovers_total)", _failovers),
    ("held for dead-lettering once drained (messages_dlx)", _held),
    ("workers that exited", lambda r: str(r.exits)),
    ("wall time", lambda r: f"{r.wall:.1f} s"),
    ("verdict", verdict_of),
]


def runs_table(reports: list[ClusterReport]) -> Table:
    table = Table(
        "figure", *(report.label for report in reports), title="semel on a 3-node cluster"
    )
    for title, cell in ROWS:
        table.add_row(title, *(cell(report) for report in reports))
    return table


def timelines(reports: list[ClusterReport]) -> list[str]:
    """What each fault did, with times from its start."""
    lines = []
    for report in reports:
        lines.append(f"{report.label}:")
        lines += [f"  {at:6.1f}s  {what}" for at, what in report.record.events]
        lines += [
            f"  duplicate {d.key} ({d.cause}): {d.evidence}" for d in report.verdict.duplicates
        ]
        lines += [f"  lost {key}" for key in report.verdict.lost[:20]]
    return lines


def publish_table(proof: PublishProof) -> Table:
    report = proof.report or {}
    table = Table("semel publish, its node SIGKILLed", "figure")
    rows = [
        ("messages asked for", str(proof.count)),
        ("node killed (in the queue by then)", f"{proof.killed} ({proof.in_queue_at_kill})"),
        ("exit code", str(proof.code)),
        ("published / confirmed", f"{report.get('published')} / {report.get('confirmed')}"),
        ("returned / nacked", f"{report.get('returned')} / {report.get('nacked')}"),
        ("failed (no answer) / not sent", f"{report.get('failed')} / {report.get('not_sent')}"),
        ("messages with an outcome", f"{proof.accounted} of {proof.count}"),
        ("keys in the queue afterwards", str(len(proof.keys_in_queue))),
        ("confirmed but not in the queue", str(len(proof.confirmed_missing))),
        ("wall time", f"{proof.wall:.1f} s"),
        ("verdict", "PASS" if proof.ok else f"FAIL: {proof.stderr[-300:]}"),
    ]
    for row in rows:
        table.add_row(*row)
    return table
