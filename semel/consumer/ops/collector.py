"""Python's cyclic garbage collector, set for a consumer that has started.

A consumer with hundreds of deliveries in flight keeps each one's coroutines,
futures and contexts alive across a store round trip. The collector's first
generation then fills with live objects after every 700 allocations, each
collection traverses them all and promotes them, and every few seconds a
full collection walks the whole heap: the modules, the handler's imports,
the pydantic models, the client libraries. In a FastStream app with semel's
middleware that was about a sixth of the process's CPU (`docs/benchmarks.md`).

:func:`tune_gc` does what long-running Python services do for this: collect
once, then freeze what start-up built (``gc.freeze``: never traversed again,
still freed by reference counting), and collect the first generation every
10,000 allocations rather than every 700, so most of a delivery's objects are
gone before a collection would have examined them. Garbage cycles are still
collected; they wait a little longer. ``semel consume`` calls it once its
workers are about to consume; an application that runs a front door calls it
once its own start-up is done.
"""

from __future__ import annotations

import gc

# Allocations (less deallocations) between collections of the first
# generation; CPython's default is 700. The older generations keep theirs.
FIRST_GENERATION_THRESHOLD = 10_000


def tune_gc() -> None:
    """Collect, freeze what exists now, and collect the first generation less often.

    Call it once the process has started (its imports, connections and
    handlers in place): what it freezes is never collected, so it should be
    what lives as long as the process. Calling it again freezes what was
    built since.
    """
    gc.collect()  # what start-up left as garbage is freed, not frozen
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(FIRST_GENERATION_THRESHOLD, second, third)
