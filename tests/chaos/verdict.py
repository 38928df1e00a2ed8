"""Counting what a chaos run did: lost keys and duplicate side effects, each with its cause.

Pure functions over what the run collected (ledger rows, kills, store
outages, the workers' settle log lines, the store's records, the DLQ), so
the classification is tested without any server.

A key has a duplicate effect when the ledger holds more than one stamped
effect for it. Every effect but the last was *superseded*: its execution did
not get its completion into the store, and a later claim ran the handler
again. Each superseded effect gets one cause, and only these count as
understood:

* ``killed`` -- its process was SIGKILLed after the effect, and its worker
  never logged the delivery as settled: killed between effect and completion,
  the at-least-once boundary no consumer can close.
* ``lease-expired-in-outage`` -- its worker logged the delivery as handed
  back because the store could not be reached (or the lease was lost), and
  the execution overlapped a store outage: the lease ran out while the store
  was away, so the key went to the next claim. An outage :class:`Window` is
  for every worker (the server stopped, filled up) or for some processes only
  (the link of one worker blackholed): it explains only their handing back.
* ``unreplicated-at-failover`` -- a primary of a replicated Redis was
  SIGKILLed (a :class:`Failover`) and its replica promoted: a write the
  primary acknowledged in the last ``REPLICATION_LAG`` seconds before the
  kill may never have reached the replica. Either the delivery settled as
  completed in that window (the completion was reported stored) and the key
  ran again after the kill; or the execution's claim was granted in that
  window (the handler started in it) and the key's next execution started
  after the kill -- the only way two executions of one key can run at the
  same time, so such an overlap is this cause, not ``unexplained``. With
  ``SEMEL_REDIS_REPLICAS_ACK`` >= 1 no write is reported before a replica has
  it, and the verdict is run with ``replicated``: this cause then fails it.

Anything else -- two effects under one fence, two executions of the key
running at the same time (but for a claim lost at a failover), a superseded
execution whose delivery settled as completed (but for a completion lost at
a failover), a lease lost with no outage -- is ``unexplained`` and fails the
run.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from tests.chaos.ledger import Run
from tests.chaos.workers import Kill

KILLED = "killed"
OUTAGE = "lease-expired-in-outage"
UNREPLICATED = "unreplicated-at-failover"
UNEXPLAINED = "unexplained"
# Settle outcomes that hand a claimed delivery back without completing it.
HANDED_BACK = ("store-unavailable", "lease-lost", "fenced-out")
# Outcomes decided by the claim alone: a copy that met the execution, not its end.
CLAIM_ONLY = ("in-progress", "duplicate")
HELD = 1.0  # seconds into an outage a completion must have waited to count as held
CLOCK_SLACK = 0.05  # seconds: log timestamps and ledger stamps are taken a moment apart
# Seconds before a primary's SIGKILL in which a write it acknowledged may not have
# reached its replica. Replication on loopback trails by milliseconds; a second
# also covers a worker whose event loop logged its settle late.
REPLICATION_LAG = 1.0


@dataclass(frozen=True, slots=True)
class Settled:
    """A worker's ``settled`` log line for one delivery."""

    key: str
    fence: int | None
    outcome: str
    at: float  # wall clock
    pid: int
    duration: float = 0.0  # seconds from the delivery's arrival to its settle

    def ran(self, run: Run) -> bool:
        """Whether this settle ended the delivery that ``run`` executed."""
        arrived = self.at - self.duration - CLOCK_SLACK
        return self.pid == run.pid and self.fence == run.fence and arrived <= run.started <= self.at


@dataclass(frozen=True, slots=True)
class Window:
    """Wall-clock seconds the store was away: for every worker, or only for ``pids``."""

    start: float
    end: float
    pids: frozenset[int] | None = None

    def hits(self, pid: int, start: float, end: float) -> bool:
        """Whether process ``pid`` was cut off from the store at some moment of [start, end]."""
        mine = self.pids is None or pid in self.pids
        return mine and start <= self.end and end >= self.start


Windows = Iterable[Window | tuple[float, float]]


@dataclass(frozen=True, slots=True)
class Failover:
    """A primary SIGKILLed at ``killed`` (wall clock), its replica promoted by ``promoted``."""

    killed: float
    promoted: float

    def acknowledged_before(self, at: float) -> bool:
        """Whether a write acknowledged at ``at`` may have died with the primary."""
        return self.killed - REPLICATION_LAG <= at <= self.killed + CLOCK_SLACK

    def after(self, run: Run) -> bool:
        return run.started >= self.killed - CLOCK_SLACK


def windows_of(outages: Windows) -> list[Window]:
    """Plain ``(start, end)`` pairs are outages for every worker."""
    return [w if isinstance(w, Window) else Window(*w) for w in outages]


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A superseded effect, its cause and the evidence for it."""

    key: str
    fence: int
    pid: int
    cause: str
    evidence: str
    returned: bool  # the handler had returned: only its completion was missing


@dataclass(slots=True)
class Verdict:
    keys: int
    completed: int
    dead_lettered: dict[str, int]  # distinct keys per x-semel-reason
    lost: list[str]
    duplicates: list[Duplicate] = field(default_factory=list)
    strict: bool = False  # transactional mode: no duplicate effect at all
    # Replicas acknowledge every write (SEMEL_REDIS_REPLICAS_ACK >= 1): none may be lost.
    replicated: bool = False
    # Keys whose handler was meant to succeed, not completed, only in Q.dlq.
    parked: list[str] = field(default_factory=list)

    def count(self, cause: str) -> int:
        return sum(1 for d in self.duplicates if d.cause == cause)

    @property
    def ok(self) -> bool:
        if self.strict and self.duplicates:
            return False
        if self.replicated and self.count(UNREPLICATED):
            return False
        return not self.lost and not self.parked and self.count(UNEXPLAINED) == 0


def read_settled(log_files: Mapping[int, Path]) -> list[Settled]:
    """The ``settled`` events of every worker's JSON log (killed ones included)."""
    found = []
    for pid, path in log_files.items():
        for line in path.read_text(errors="replace").splitlines():
            if '"settled"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut by SIGKILL
            if event.get("event") != "settled" or event.get("key") is None:
                continue
            at = datetime.fromisoformat(event["timestamp"]).timestamp()
            duration = float(event.get("duration_ms", 0)) / 1000
            found.append(
                Settled(event["key"], event.get("fence"), event["outcome"], at, pid, duration)
            )
    return found


def held_through(settled: Iterable[Settled], outages: Windows) -> int:
    """Deliveries that arrived before an outage and completed well into it or after it.

    Handlers run for at most a few hundred ms: a delivery that completed more
    than ``HELD`` seconds after the store went away waited for it. (The end of
    a window is when the restart command returned, a moment after the
    workers may already have reached the store again.)
    """
    windows = windows_of(outages)
    return sum(
        1
        for s in settled
        if s.outcome.startswith("completed")
        and any(
            (w.pids is None or s.pid in w.pids) and s.at - s.duration < w.start < s.at - HELD
            for w in windows
        )
    )


def _overlaps(pid: int, start: float, end: float, windows: list[Window]) -> bool:
    return any(w.hits(pid, start, end) for w in windows)


def _ended(run: Run) -> float:
    """When ``run`` was last known to run: its end, or for one cut short, its effect."""
    if run.ended is not None:
        return run.ended
    return run.effect if run.effect is not None else run.started


def alongside(run: Run, others: Iterable[Run]) -> Run | None:
    """Another execution of the key that ran at the same time as ``run``, if any.

    One claim at a time means one execution at a time: a key's executions
    follow each other, whatever fault came between them. Two that overlap
    (by more than the clock slack) ran under two live claims, or one worker
    ran on after its lease was gone.
    """
    for other in others:
        if other is run or other.key != run.key:
            continue
        if other.started < _ended(run) - CLOCK_SLACK and run.started < _ended(other) - CLOCK_SLACK:
            return other
    return None


def overlapping(runs: Iterable[Run]) -> list[tuple[Run, Run]]:
    """Pairs of executions of one key that ran at the same time, effect or not.

    Without an effect in both, no duplicate comes of it (a transaction rolled
    back, a handler cut short before its effect), but the key was still run
    by two at once: a figure of its own.
    """
    by_key: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_key[run.key].append(run)
    pairs = []
    for executions in by_key.values():
        executions.sort(key=lambda run: run.started)
        for n, run in enumerate(executions):
            later = executions[n + 1 :]
            pairs += [(run, other) for other in later if alongside(run, [other]) is not None]
    return pairs


def lost_at_failover(
    run: Run, executions: Iterable[Run], settled: Iterable[Settled], failovers: Iterable[Failover]
) -> str | None:
    """Why ``run``'s key ran again after a failover lost a write of it: evidence, or None.

    Its claim was granted (its handler started) shortly before the primary was
    killed, or its delivery settled as completed then, and the key's next
    execution started after the kill.
    """
    later = [other for other in executions if other is not run and other.started > run.started]
    for failover in failovers:
        if not any(failover.after(other) for other in later):
            continue
        before = failover.killed - run.started
        if failover.acknowledged_before(run.started):
            return (
                f"pid {run.pid} fence {run.fence} started {before:.3f}s before the primary's "
                "SIGKILL and the key ran again after it: the claim was not replicated"
            )
        for event in settled:
            if (
                event.ran(run)
                and event.outcome.startswith("completed")
                and failover.acknowledged_before(event.at)
            ):
                return (
                    f"pid {run.pid} settled fence {run.fence} as {event.outcome!r} "
                    f"{failover.killed - event.at:.3f}s before the primary's SIGKILL and the "
                    "key ran again after it: the completion was not replicated"
                )
    return None


def claim_lost(pair: tuple[Run, Run], failovers: Iterable[Failover]) -> bool:
    """Whether two executions at once follow a claim the failed primary had not replicated."""
    first, second = sorted(pair, key=lambda run: run.started)
    return any(f.acknowledged_before(first.started) and f.after(second) for f in failovers)


def classify(
    effect: Run,
    settled: list[Settled],
    kills: Iterable[Kill],
    outages: Windows,
) -> tuple[str, str]:
    """Why ``effect`` did not end in a completion: (cause, evidence)."""
    assert effect.effect is not None
    windows = windows_of(outages)
    outcomes = [s for s in settled if s.ran(effect) and not s.outcome.startswith(CLAIM_ONLY)]
    if outcomes:
        last = outcomes[-1]
        if last.outcome.startswith(HANDED_BACK) and _overlaps(
            effect.pid, effect.started, last.at, windows
        ):
            ended = "returned" if effect.outcome == "returned" else "was cut short"
            return OUTAGE, (
                f"pid {effect.pid}: the handler {ended}, then the delivery settled as "
                f"{last.outcome!r} {last.at - effect.effect:.2f}s after the effect, in the outage"
            )
        return UNEXPLAINED, f"pid {effect.pid} settled fence {effect.fence} as {last.outcome!r}"
    killed = [k for k in kills if k.pid == effect.pid and k.at >= effect.effect]
    if killed:
        after = killed[0].at - effect.effect
        return KILLED, f"pid {effect.pid} SIGKILLed {after:.3f}s after the effect"
    return UNEXPLAINED, f"pid {effect.pid} neither killed after the effect nor settled"


def duplicates_of(
    runs: Iterable[Run],
    settled: Iterable[Settled],
    kills: Iterable[Kill],
    outages: Windows,
    failovers: Iterable[Failover] = (),
) -> list[Duplicate]:
    """Every superseded effect with its cause.

    A lost write at a failover explains only what nothing else does: a kill
    or an outage comes first.
    """
    effects: dict[str, list[Run]] = defaultdict(list)
    executions: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        executions[run.key].append(run)
        if run.effect is not None:
            effects[run.key].append(run)
    by_key: dict[str, list[Settled]] = defaultdict(list)
    for event in settled:
        by_key[event.key].append(event)
    kills, windows, failovers = list(kills), windows_of(outages), list(failovers)
    found = []
    for key, done in effects.items():
        done.sort(key=lambda run: run.effect or 0.0)
        fences = Counter(run.fence for run in done)
        for run in done[:-1]:
            if fences[run.fence] > 1:
                cause, evidence = (
                    UNEXPLAINED,
                    f"{fences[run.fence]} effects under fence {run.fence}",
                )
            elif other := alongside(run, executions[key]):
                together = min(_ended(run), _ended(other)) - max(run.started, other.started)
                cause, evidence = (
                    UNEXPLAINED,
                    f"pid {run.pid} fence {run.fence} ran at the same time as pid {other.pid} "
                    f"fence {other.fence} ({together:.2f}s together)",
                )
            else:
                cause, evidence = classify(run, by_key[key], kills, windows)
            if cause == UNEXPLAINED and (
                lost := lost_at_failover(run, executions[key], by_key[key], failovers)
            ):
                cause, evidence = UNREPLICATED, lost
            returned = run.outcome == "returned"
            found.append(Duplicate(key, run.fence, run.pid, cause, evidence, returned))
    return found


def judge(
    keys: Iterable[str],
    completed: set[str],
    dead_letters: Mapping[str, set[str]],
    duplicates: list[Duplicate],
    failing: set[str] | None = None,
) -> Verdict:
    """``dead_letters``: key -> the reasons its dead letters carry.

    ``failing``: the keys whose handler is meant to fail for good; any other
    key that did not complete but went to ``Q.dlq`` was *parked* there by a
    fault (claimed too many times, say): not lost, but its work never done.
    """
    keys = list(keys)
    reasons: Counter[str] = Counter()
    for key in keys:
        for reason in dead_letters.get(key, ()):
            reasons[reason] += 1
    lost = [k for k in keys if k not in completed and k not in dead_letters]
    parked = []
    if failing is not None:
        parked = [k for k in keys if k in dead_letters and k not in completed and k not in failing]
    return Verdict(
        keys=len(keys),
        completed=sum(1 for k in keys if k in completed),
        dead_lettered=dict(sorted(reasons.items())),
        lost=lost,
        duplicates=duplicates,
        parked=parked,
    )
