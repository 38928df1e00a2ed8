"""``python -m bench.outbox.relay``: one outbox relay, as ``semel relay`` runs it, until SIGTERM.

It reads its settings from ``SEMEL_*`` and runs ``Semel().relay()`` on uvloop,
like the worker. Two additions for the benchmark, each off unless asked for:

- ``BENCH_CONFIRMS=<file>``: one line per message the broker confirmed,
  ``<message id> <CLOCK_MONOTONIC ns>``, taken when the relay receives the
  confirm (one clock for every process of the machine, so the benchmark can
  subtract its own commit times);
- ``BENCH_PROFILE=<file>``: the relay runs under cProfile, written there at exit.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import signal
import sys
from collections.abc import Callable

from bench.outbox.confirms import record_confirms
from semel import Semel

CONFIRMS_ENV = "BENCH_CONFIRMS"
PROFILE_ENV = "BENCH_PROFILE"

LOOP_FACTORY: Callable[[], asyncio.AbstractEventLoop] | None = None
try:
    import uvloop

    LOOP_FACTORY = uvloop.new_event_loop
except ImportError:
    pass


async def relay(stop: asyncio.Event, confirms: str | None) -> None:
    engine = Semel()
    async with engine.relay():
        # Wrapped once the relay's modules are loaded; the benchmark's warm-up
        # messages cover the moment before.
        if confirms and not record_confirms(confirms):
            print("the relay does not publish through publish_confirmed", file=sys.stderr)
        await stop.wait()


def main() -> int:
    confirms = os.environ.get(CONFIRMS_ENV)
    profile = os.environ.get(PROFILE_ENV)
    profiler = cProfile.Profile() if profile else None
    with asyncio.Runner(loop_factory=LOOP_FACTORY) as runner:
        stop = asyncio.Event()
        runner.get_loop().add_signal_handler(signal.SIGTERM, stop.set)
        if profiler is not None:
            profiler.enable()
        runner.run(relay(stop, confirms))
    if profiler is not None and profile:
        profiler.disable()
        profiler.dump_stats(profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
