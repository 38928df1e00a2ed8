"""The commands ``bench.dlq`` times, in the order it runs them, and what each must leave:
the DLQ's depth after it and what its output must say."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from bench.dlq.letters import BURST, Kind
from semel.consumer.names import Reason

FILTERED = Reason.POISON  # the filtered list's --reason
LISTED = 50  # what `semel dlq list` shows at most by default


@dataclass(frozen=True, slots=True)
class Step:
    """A command, the DLQ's depth it must leave and what its output must say."""

    name: str
    args: list[str]
    depth: int
    says: Callable[[str], list[str]]  # its problems with the output


def saying(*texts: str) -> Callable[[str], list[str]]:
    return lambda out: [f"output lacks {text!r}" for text in texts if text not in out]


def rows(count: int) -> Callable[[str], list[str]]:
    """A table of ``count`` rows (rich draws each between "│" borders, one line each)."""

    def says(out: str) -> list[str]:
        drawn = sum(1 for line in out.splitlines() if line.startswith("│"))
        return [] if drawn == count else [f"{drawn} rows shown, not {count}"]

    return says


def both(*checks: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    return lambda out: [problem for check in checks for problem in check(out)]


def filtered_json(letters: int, matched: int) -> Callable[[str], list[str]]:
    def says(out: str) -> list[str]:
        try:
            got = orjson.loads(out)
            counts = (got["depth"], got["matched"], len(got["dead_letters"]))
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            return [f"not the JSON expected: {exc!r}"]
        wanted = (letters, matched, min(LISTED, matched))
        return [] if counts == wanted else [f"depth, matched, shown {counts}, not {wanted}"]

    return says


def steps(kinds: list[Kind], rate: float, to: str) -> list[Step]:
    letters, count = len(kinds), Counter(kinds)
    burst, gid = count[BURST], BURST.group_id
    matched = sum(n for kind, n in count.items() if kind.reason is FILTERED)
    replay = ["dlq", "replay", "--group", gid]
    return [
        Step("list --limit 20", ["dlq", "list", "--limit", "20"], letters,
             both(saying(f"{letters} in the DLQ"), rows(20))),
        Step("groups", ["dlq", "groups"], letters,
             saying(f"{letters} dead letters read", f"{len(count)} groups", gid)),
        Step(f"list --reason {FILTERED.value} --json",
             ["dlq", "list", "--reason", FILTERED.value, "--json"],
             letters, filtered_json(letters, matched)),
        Step("replay --group <burst> --dry-run", [*replay, "--dry-run"], letters,
             saying(f"would replay {burst}")),
        Step(f"replay --group <burst> --rate {rate:g} --to <queue>",
             [*replay, "--rate", f"{rate:g}", "--to", to], letters - burst,
             saying(f"replayed {burst}, kept {letters - burst}")),
    ]  # fmt: skip
