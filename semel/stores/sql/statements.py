"""The statements that decide a key, written once for both SQL stores.

The PostgreSQL and the SQLite store claim with the same upsert and write
with the same fenced updates, and :mod:`semel.stores.shared.refusal` judges both stores'
refusals alike, so the text that decides lives here, once. The two dialects
differ only in how a few words are spelled; a :class:`Dialect` spells them:

``{now}``               the clock. PostgreSQL reads its own, ``now()``
                        (timestamptz); SQLite is given the store's, bound
                        as ``:now`` (integer epoch ms, read once the write
                        lock is held).
``{now_plus[d]}``       the clock plus the duration parameter ``d``:
                        ``now() + make_interval(secs => %(d)s)``, in
                        seconds, against ``:now + :d``, in ms.
``{p[x]}``              the parameter ``x``: psycopg's ``%(x)s`` against
                        sqlite3's ``:x``.
``{fence_clock}``       the clock a fence starts from, integer microseconds
                        since the Unix epoch: the server's
                        ``clock_timestamp()`` in PostgreSQL, read as the row
                        is written; SQLite's ``:now_us``, bound from the same
                        reading as ``:now``.
``{greatest}``          the larger of two values: ``greatest`` / ``max``.
``{false}``             SQLite has no boolean type: ``0``.
``{result_text}``       the result column as read back: ``result::text``
                        from PostgreSQL's jsonb, ``result`` from SQLite's
                        TEXT.

Where a claim's rows come from (arrays, a JSON object, one key), the batched
completion, the purge and the schema are each one dialect's own and stay in
:mod:`semel.stores.postgres.sql` and :mod:`semel.stores.sqlite.sql`.
"""

from __future__ import annotations

from dataclasses import dataclass

# A fence only grows, even across a forgotten record. A key with no row (never
# seen, or purged) starts at the clock in microseconds; a row past retention
# counts as absent but still holds its fence, so it starts at the larger of
# that clock and its fence + 1; a live row taken over gets fence + 1. A takeover
# waits for a lease to lapse or a release, a store round trip at the very
# least, so + 1 per takeover never overtakes a clock gaining a million a
# second: a key forgotten and claimed again starts above every fence it had,
# unless the clock was set back across the gap by more than the time since
# the key's first grant.
#
# Past retention a row counts as absent (its fence still grows). A live row
# gets past the claim's WHERE clause only when it is in progress with the same
# fingerprint and no lease, so "live" alone tells a takeover from a fresh start.
# The claim and the read after a refusal share these, so they never disagree.
LIVE = "(t.expires_at > {now})"
LEASED = "coalesce(t.lock_expires_at > {now}, {false})"
POISONED = "(t.expires_at > {now} AND t.claims >= {p[max_claims]})"

# What a claim and a read return, in this order: the stores decode by position.
COLUMNS = (
    "key, fingerprint, status, fence, claims, lock_expires_at, {result_text}, error,"
    " first_seen, updated_at, expires_at"
)

# A first claim's values after its key and fingerprint, which each dialect's
# rows name: the ``{first_claim}`` of those rows.
FIRST_CLAIM = "'in_progress', {fence_clock}, 1, {now_plus[ttl]}, {now}, {now}, {now_plus[hold]}"

CLAIM = """
INSERT INTO {table} AS t (key, fingerprint, status, fence, claims, lock_expires_at,
                          first_seen, updated_at, expires_at)
{rows}
ON CONFLICT (key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    status = CASE WHEN {poisoned} THEN 'failed' ELSE 'in_progress' END,
    fence = CASE WHEN {poisoned} THEN t.fence WHEN {live} THEN t.fence + 1
                 ELSE {greatest}(t.fence + 1, {fence_clock}) END,
    claims = CASE WHEN {poisoned} THEN t.claims WHEN {live} THEN t.claims + 1 ELSE 1 END,
    lock_expires_at = CASE WHEN {poisoned} THEN NULL ELSE excluded.lock_expires_at END,
    result = NULL,
    error = CASE WHEN {poisoned} THEN {p[poison_error]} END,
    first_seen = CASE WHEN {live} THEN t.first_seen ELSE {now} END,
    updated_at = {now},
    expires_at = CASE WHEN {poisoned} THEN {now_plus[retention]} ELSE excluded.expires_at END
WHERE NOT {live}
   OR (t.status = 'in_progress' AND t.fingerprint = excluded.fingerprint AND NOT {leased})
RETURNING {columns}
"""

# The rows a refused claim hit (or ``get`` reads), with the claim's own view
# of them: live, leased, both by the store's clock.
INSPECT = "SELECT {columns}, {live}, {leased} FROM {table} AS t WHERE {which}"
BY_KEY = "key = {p[key]}"

# Every fenced write: only the owner of the current fence changes the row.
FENCED = " WHERE key = {p[key]} AND fence = {p[fence]} AND status = 'in_progress'"
# {result}: the completion's result as stored, which the caller spells.
SET_COMPLETE = """status = 'completed', result = {result}, lock_expires_at = NULL,
    updated_at = {now}, expires_at = {now_plus[retention]}"""
SET_RELEASE = "lock_expires_at = {now}, updated_at = {now}, expires_at = {now_plus[hold]}"
SET_FAIL = """status = 'failed', error = {p[error]}, lock_expires_at = NULL,
    updated_at = {now}, expires_at = {now_plus[retention]}"""
SET_HEARTBEAT = """lock_expires_at = {now_plus[ttl]}, updated_at = {now},
    expires_at = {now_plus[hold]}"""
# Only a lease still running is renewed. A release ends the lease at its own
# instant, so a heartbeat that lands after it (a renewal the release did not
# wait for) finds it over and cannot hold the key for nobody.
UNEXPIRED = FENCED + " AND lock_expires_at > {now}"
# A NULL {p[fingerprint]} keeps the row's; one given is an edited body's, which
# the next claim must bring.
SET_RESET = """status = 'in_progress', claims = 0, result = NULL, error = NULL,
    fingerprint = coalesce({p[fingerprint]}, fingerprint),
    lock_expires_at = {now}, updated_at = {now}, expires_at = {now_plus[hold]}"""
# Only a failed key is reset, poison included: marked failed, or in progress
# with its claims used up and no lease (the next claim would mark it). A row
# past retention is absent: resetting it would revive its fingerprint. A
# completed key stays completed, so a replayed copy of it is a duplicate, and
# a claim in hand keeps its lease.
FAILED_KEY = """ WHERE key = {p[key]} AND expires_at > {now}
    AND (status = 'failed' OR (status = 'in_progress' AND claims >= {p[max_claims]}
                               AND NOT coalesce(lock_expires_at > {now}, {false})))"""


class _Each:
    """``{word[x]}`` in a template: ``pattern`` with ``x`` in place of its ``{}``."""

    def __init__(self, pattern: str) -> None:
        self._pattern = pattern

    def __getitem__(self, name: str) -> str:
        return self._pattern.format(name)


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one SQL dialect spells the words the templates leave open."""

    now: str
    now_plus: str  # "{}" stands for the duration parameter's name
    param: str  # "{}" stands for the parameter's name
    fence_clock: str
    greatest: str
    false: str
    result_text: str

    def render(self, template: str, **parts: str) -> str:
        """``template`` in this dialect; ``parts`` fill its other placeholders."""
        words: dict[str, object] = {
            "now": self.now,
            "now_plus": _Each(self.now_plus),
            "p": _Each(self.param),
            "fence_clock": self.fence_clock,
            "greatest": self.greatest,
            "false": self.false,
            "result_text": self.result_text,
        }
        return template.format_map(words | parts)


@dataclass(frozen=True, slots=True)
class Shared:
    """The shared statements in one dialect, on one table.

    ``table`` is the quoted name, or a placeholder the caller fills in later.
    """

    dialect: Dialect
    table: str

    def _render(self, template: str, **parts: str) -> str:
        render = self.dialect.render
        judged = {"live": render(LIVE), "leased": render(LEASED), "columns": render(COLUMNS)}
        return render(template, table=self.table, **judged, **parts)

    def claim(self, rows: str) -> str:
        """The claim upsert of the keys ``rows`` yields, each with ``{first_claim}``."""
        render = self.dialect.render
        rows = render(rows, first_claim=render(FIRST_CLAIM))
        return self._render(CLAIM, rows=rows, poisoned=render(POISONED))

    def inspect(self, which: str = BY_KEY) -> str:
        """The rows ``which`` selects (the key parameter's by default), with live and leased."""
        return self._render(INSPECT, which=self.dialect.render(which))

    def set_complete(self, result: str) -> str:
        """The assignments of a completion storing ``result``."""
        return self.dialect.render(SET_COMPLETE, result=result)

    def update(self, assignments: str, where: str = FENCED, **parts: str) -> str:
        """``UPDATE`` of the table; fenced unless ``where`` says otherwise."""
        return f"UPDATE {self.table} SET " + self.dialect.render(assignments + where, **parts)

    def complete(self, result: str) -> str:
        """The fenced completion storing ``result``."""
        return self.update(SET_COMPLETE, result=result)

    def release(self) -> str:
        return self.update(SET_RELEASE)

    def fail(self) -> str:
        return self.update(SET_FAIL)

    def heartbeat(self) -> str:
        return self.update(SET_HEARTBEAT, UNEXPIRED)

    def reset(self) -> str:
        return self.update(SET_RESET, FAILED_KEY)
