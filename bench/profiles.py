"""``python -m bench.profiles FILE...``: where a profiled consumer's time went.

Reads the cProfile statistics ``python -m bench --front faststream --profile
DIR`` writes (one file per drain) and prints, for each file, the time the
cyclic garbage collector's pauses took (from ``<file>.gc.json``), the share
of the profiled time each package took, then the functions with the most
time of their own and the semel calls with the most time in all they called.
``--messages N`` turns the times into µs per message. ``--against FILE``
(the bare subscriber's drain of as many messages, say) adds its time per
package and the difference, and ranks the packages by that difference: what
the extra time is made of.

A C function's own time (``{method ...}``, a builtin) is counted to the
package of the Python code that called it, shared out the way cProfile
recorded its callers: a ``bytes.decode`` inside pamqp is pamqp's cost.
Only what runs as Python calls is seen: uvloop's own C work between
callbacks is not, and cProfile's overhead makes every call look dearer
(shares hold up better than the absolute figures).
"""

from __future__ import annotations

import argparse
import json
import pstats
import sys
import sysconfig
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()
BUILTIN = "~"  # cProfile's file name for a C function
Function = tuple[str, int, str]  # file, line, name: a pstats key


def package_of(filename: str) -> str:
    """The package a function belongs to: ``aiormq``, ``semel.consumer.delivery``, ``asyncio``."""
    if filename == BUILTIN:
        return "builtins"
    if filename.startswith("<frozen"):
        return "importlib"
    if "site-packages/" in filename:
        top = filename.split("site-packages/", 1)[1].split("/")[0]
        return top.removesuffix(".py")
    path = Path(filename).resolve()
    for base in (ROOT, STDLIB):
        if not path.is_relative_to(base):
            continue
        parts = [part.removesuffix(".py") for part in path.relative_to(base).parts]
        # semel by sub-package (semel.consumer.delivery), the rest by top-level name.
        return ".".join(parts[:3]) if parts[0] == "semel" else parts[0]
    return filename


def own_times(stats: dict[Function, Any]) -> dict[str, float]:
    """Seconds of own time per package, a C function's counted to its callers' packages."""
    times: dict[str, float] = defaultdict(float)
    for (filename, _line, _name), (_cc, _nc, tottime, _ct, callers) in stats.items():
        if filename != BUILTIN or not callers:
            times[package_of(filename)] += tottime
            continue
        # Each caller's entry holds the time this function spent for it (third field).
        shares = {caller: entry[2] for caller, entry in callers.items()}
        whole = sum(shares.values()) or 1.0
        for (caller_file, _l, _n), part in shares.items():
            times[package_of(caller_file)] += tottime * part / whole
    return times


def label(function: Function) -> str:
    filename, line, name = function
    if filename == BUILTIN:
        return name
    where = package_of(filename)
    return f"{where}:{Path(filename).name}:{line}({name})"


def load(path: Path) -> dict[Function, Any]:
    stats: dict[Function, Any] = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    return stats


def summarise(path: Path, messages: int | None, top: int, against: Path | None = None) -> str:
    stats = load(path)
    total = sum(entry[2] for entry in stats.values())
    per = 1e6 / messages if messages else None
    unit = "µs/msg" if per else "s"

    def amount(seconds: float) -> str:
        return f"{seconds * per:8.1f}" if per else f"{seconds:8.3f}"

    lines = [f"== {path.name}: {amount(total)} {unit} profiled"]
    pauses = Path(f"{path}.gc.json")
    if pauses.exists():
        # Inside the profiled time: cProfile counts each pause to the function it interrupted.
        by_generation = json.loads(pauses.read_text())
        seconds = sum(spent for _count, spent in by_generation.values())
        counts = ", ".join(f"gen{g}: {count:,}" for g, (count, _spent) in by_generation.items())
        lines.append(f"-- garbage collector: {amount(seconds)} {unit} ({counts} collections)")
    lines.append("-- own time by package (C functions counted to their callers)")
    packages = own_times(stats)
    if against is None:
        for name, seconds in sorted(packages.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"{seconds / total:6.1%} {amount(seconds)}  {name}")
    else:
        theirs = own_times(load(against))
        base = sum(theirs.values())
        lines.append(f"   ({against.name}: {amount(base)}; this: {amount(total - base)} more)")
        lines.append("  share     this  against     more")
        names = set(packages) | set(theirs)
        ranked_by = sorted(names, key=lambda n: theirs.get(n, 0.0) - packages.get(n, 0.0))
        for name in ranked_by[:top]:
            mine, other = packages.get(name, 0.0), theirs.get(name, 0.0)
            line = f"{mine / total:6.1%} {amount(mine)} {amount(other)} {amount(mine - other)}"
            lines.append(f"{line}  {name}")
    lines.append("-- functions with the most own time")
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    for function, (_cc, calls, tottime, _ct, _callers) in ranked:
        lines.append(f"{tottime / total:6.1%} {amount(tottime)} {calls:>9,}  {label(function)}")
    lines.append("-- semel's calls with the most time in all they called")
    semel = [kv for kv in stats.items() if package_of(kv[0][0]).startswith("semel")]
    semel.sort(key=lambda kv: -kv[1][3])
    for function, (_cc, calls, _tt, cumtime, _callers) in semel[:top]:
        lines.append(f"{cumtime / total:6.1%} {amount(cumtime)} {calls:>9,}  {label(function)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profiles", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--messages", type=int, help="messages the drain took: µs per message")
    parser.add_argument("--top", type=int, default=15, help="rows per list (15)")
    parser.add_argument("--against", type=Path, help="a profile to compare each package with")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    for path in args.files:
        print(summarise(path, args.messages, args.top, args.against))
    return 0


if __name__ == "__main__":
    sys.exit(main())
