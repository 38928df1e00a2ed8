"""The outbox chaos run's table, in the chaos table's form: a row per figure, a column per run."""

from __future__ import annotations

from collections.abc import Callable

from rich.table import Table

from tests.chaos.verdict import KILLED, UNEXPLAINED
from tests.outbox_chaos.run import Report


def _requests(r: Report) -> str:
    d = r.driven
    repeats = sum(1 for given in d.answers.values() if len(given) > 1)
    return f"{d.requests} ({d.retries} sent again after a lost answer, {repeats} client repeats)"


def _lost_answers(r: Report) -> str:
    why = ", ".join(f"{reason} {n}" for reason, n in r.driven.lost_answers.most_common(4))
    return f"{r.driven.retries} ({why})" if why else "0"


def _processes(r: Report) -> str:
    c = r.config
    return f"{c.web} web ({c.relays_in_web} with a relay inside), {c.relays} semel relay"


def _kills(r: Report) -> str:
    text = f"{r.web_kills} web, {r.relay_kills} relay, {r.consumer_kills} consumer"
    return f"{text} ({r.exits} exited by themselves)" if r.exits else text


def _published(r: Report) -> str:
    v = r.verdict
    return f"{v.published} message ids ({v.copies} copies routed, {v.copies - v.published} again)"


def _verdict(r: Report) -> str:
    if r.ok:
        return "PASS"
    v = r.verdict
    why = [
        text
        for text, bad in (
            ("drain deadline missed", not r.drained),
            ("orders never answered", r.driven.unanswered),
            ("lost", v.lost),
            ("wrong message id", v.wrong_id),
            ("rolled-back published", v.rolled_back_published),
            ("staged without an order", v.staged_without_order),
            ("answered, not committed", v.answered_not_committed),
            ("unsent", v.unsent),
            ("not consumed", v.not_consumed),
            ("unexplained duplicates", v.count(UNEXPLAINED)),
        )
        if bad
    ]
    return "FAIL: " + ", ".join(why)


ROWS: list[tuple[str, Callable[[Report], object]]] = [
    ("seed", lambda r: r.config.seed),
    ("orders (keys)", lambda r: r.config.orders),
    ("  sent with fail: rolled back on purpose", lambda r: r.verdict.rolled_back),
    ("HTTP requests", _requests),
    ("  answers lost (sent again, same key)", _lost_answers),
    ("producing processes", _processes),
    ("SIGKILLs", _kills),
    ("broker restarts", lambda r: r.broker_restarts),
    ("PostgreSQL restarts (-m immediate)", lambda r: r.pg_restarts),
    ("orders committed (orders table)", lambda r: r.verdict.committed),
    ("outbox rows", lambda r: r.verdict.outbox_rows),
    ("published", _published),
    ("lost (committed, never published)", lambda r: len(r.verdict.lost)),
    ("wrong message id (keys)", lambda r: len(r.verdict.wrong_id)),
    ("rolled-back published", lambda r: len(r.verdict.rolled_back_published)),
    ("staged without an order", lambda r: len(r.verdict.staged_without_order)),
    ("answered 2xx, not committed", lambda r: len(r.verdict.answered_not_committed)),
    ("unsent after the drain", lambda r: r.verdict.unsent),
    ("consumer executions / effects", lambda r: f"{r.executions} / {r.effects}"),
    ("committed, not completed downstream", lambda r: len(r.verdict.not_consumed)),
    ("duplicate effects: explained by a kill", lambda r: r.verdict.count(KILLED)),
    ("duplicate effects: unexplained", lambda r: r.verdict.count(UNEXPLAINED)),
    ("wall time", lambda r: f"{r.wall:.1f} s"),
    ("verdict", _verdict),
]  # fmt: skip


def render(reports: list[Report]) -> Table:
    table = Table(title="semel outbox chaos run", show_lines=False)
    table.add_column("figure")
    for report in reports:
        listen = "LISTEN/NOTIFY" if report.config.listen else "sweep only"
        table.add_column(f"seed {report.config.seed}, {listen}", overflow="fold")
    for label, value in ROWS:
        table.add_row(label, *(str(value(report)) for report in reports))
    return table


def evidence(report: Report, limit: int = 10) -> list[str]:
    """The keys behind each failing figure, up to ``limit`` each."""
    v, name = report.verdict, f"seed {report.config.seed}"
    found = [
        ("lost", v.lost),
        ("wrong message id", v.wrong_id),
        ("rolled-back published", v.rolled_back_published),
        ("staged without an order", v.staged_without_order),
        ("answered, not committed", v.answered_not_committed),
        ("not consumed", v.not_consumed),
        ("never answered", report.driven.unanswered),
    ]
    lines = [f"{name}: {what} {key}" for what, keys in found for key in keys[:limit]]
    lines += [
        f"{name}: {d.cause} {d.key} fence {d.fence}: {d.evidence}"
        for d in v.duplicates
        if d.cause == UNEXPLAINED
    ][:limit]
    return lines
