"""The handler semel runs in the benchmark: no work, so what is measured is semel itself.

``SEMEL_HANDLER=bench.handlers:handle``. It is ``async`` because semel runs a
plain function on a thread of its own, which would be measured too.
"""

from __future__ import annotations

import time

from bench.probes import SENT_HEADER, ProbeLog
from semel.consumer import Context

_probes = ProbeLog.from_env()


async def handle(context: Context) -> None:
    """Do nothing; for a latency probe, note how long ago it was published."""
    sent = context.headers.get(SENT_HEADER)
    if isinstance(sent, int):
        _probes.write(time.monotonic_ns() - sent)
