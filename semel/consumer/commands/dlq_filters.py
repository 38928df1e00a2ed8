"""The filter options of ``semel dlq list``, ``groups`` and ``replay``, declared once.

:func:`with_filters` adds the options to a command and hands it one
:class:`semel.consumer.broker.letter_filters.LetterFilter`, so the three
commands take the same options, spelled and checked the same way.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from typer import Option

from semel.consumer.broker.letter_filters import LetterFilter
from semel.consumer.commands.common import fail
from semel.consumer.errors import EXIT_USAGE
from semel.consumer.names import Reason

_RELATIVE = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_WHEN_HELP = "ISO 8601 (UTC unless it names an offset) or a time ago: 90m, 2h, 3d."


def parse_when(text: str, now: datetime) -> datetime:
    """An instant from ``2026-11-27T10:00:00+01:00`` (UTC if no offset) or ``90m`` /
    ``2h`` / ``3d`` / ``1w`` / ``30s`` before ``now``; ``ValueError`` otherwise."""
    text = text.strip()
    relative = _RELATIVE.fullmatch(text)
    if relative is not None:
        amount, unit = relative.groups()
        return now - timedelta(**{_UNITS[unit]: int(amount)})
    instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return instant if instant.tzinfo else instant.replace(tzinfo=UTC)


def _filter_of(
    reason: list[Reason] | None,
    group: list[str] | None,
    key: str | None,
    key_prefix: str | None,
    routing_key: str | None,
    error: str | None,
    since: str | None,
    until: str | None,
    min_attempts: int | None,
) -> LetterFilter:
    now = datetime.now(UTC)
    instants: dict[str, datetime | None] = {}
    for name, text in (("since", since), ("until", until)):
        try:
            instants[name] = None if text is None else parse_when(text, now)
        except ValueError:
            fail(f"--{name} {text!r}: give ISO 8601 or a time ago such as 90m, 2h, 3d", EXIT_USAGE)
    return LetterFilter(
        reasons=frozenset(r.value for r in reason or ()),
        group_ids=frozenset(group or ()),
        key=key,
        key_prefix=key_prefix,
        routing_key=routing_key,
        error=error,
        since=instants["since"],
        until=instants["until"],
        min_attempts=min_attempts,
    )


# The options, in the order --help lists them. Each command receives them as one
# ``filters: LetterFilter`` argument.
_OPTIONS: dict[str, Any] = {
    "reason": Annotated[
        list[Reason] | None, Option(help="Dead letters with this reason (repeatable).")
    ],
    "group": Annotated[
        list[str] | None,
        Option(help="Dead letters of this group, as `semel dlq groups` shows it (repeatable)."),
    ],
    "key": Annotated[str | None, Option(help="Dead letters of this key.")],
    "key_prefix": Annotated[str | None, Option(help="Dead letters whose key starts with this.")],
    "routing_key": Annotated[
        str | None,
        Option(help="Dead letters first published with this routing key (or topic pattern)."),
    ],
    "error": Annotated[
        str | None, Option(help="Dead letters whose error contains this text (any case).")
    ],
    "since": Annotated[str | None, Option(help=f"Dead-lettered at or after: {_WHEN_HELP}")],
    "until": Annotated[str | None, Option(help=f"Dead-lettered before: {_WHEN_HELP}")],
    "min_attempts": Annotated[
        int | None, Option(min=0, help="Dead letters that ran at least this many attempts.")
    ],
}


def with_filters(command: Callable[..., None]) -> Callable[..., None]:
    """``command(filters: LetterFilter, ...)`` as a typer command that takes the
    filter options first, then its own."""
    own = inspect.signature(command, eval_str=True)
    kept = [p for name, p in own.parameters.items() if name != "filters"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
        for name, kind in _OPTIONS.items()
    ]
    keyword_only = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in kept]

    @functools.wraps(command)
    def run(**options: Any) -> None:
        chosen = {name: options.pop(name) for name in _OPTIONS}
        command(filters=_filter_of(**chosen), **options)

    run.__signature__ = own.replace(parameters=[*added, *keyword_only])  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in (*added, *keyword_only)} | {"return": None}
    return run
