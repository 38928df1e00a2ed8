"""The kinds of fault a chaos run can inject, and the links to the store they need.

- ``classic``: SIGKILLs mid-handler, a broker restart and a store outage (the
  server stopped, or for DynamoDB its port cut), all in one run.
- ``full`` (Redis only): the server fills up. ``maxmemory`` is set just above
  ``used_memory`` with ``noeviction`` for ``outage`` seconds, so writes get
  ``OOM`` replies while reads still answer; then the old values come back.
- ``blackhole``: one worker (slot 0) reaches the store through a
  :class:`~tests.proxy.TcpProxy` of its own, the others directly. While it
  runs handlers the proxy stalls for ``stall`` seconds (more than two
  leases): its bytes are still acknowledged by the kernel, nothing answers
  and nothing is reset, so it only notices by its own deadlines. Then the
  link resumes and everything held is delivered late.
- ``slow``: every worker reaches the store through one proxy that holds each
  chunk ``slow_delay`` seconds in each direction, for the whole run, with a
  prefetch of 256 (each worker takes that many deliveries at once), the
  run's 2.5 s lease, and the messages published ``SLOW_BURST`` times as fast
  so the prefetch windows do fill up. 50 ms each way, the top of the range
  a store in another region shows (100 ms round trips, several for a
  transaction), is the harshest realistic link: every store call, lease
  renewals included, then queues behind hundreds of others for a pool of a
  few connections, and a lease of 2.5 s leaves little room for that.

- ``rolling``: the handler is a plain ``def`` (it runs on a thread, which
  nothing can cancel) and the workers are restarted as a rolling upgrade
  does it: SIGTERMed mid-handler with a shutdown grace shorter than most
  handlers, started again once they have exited, with SIGKILLs mid-handler
  between those restarts. A thread outlives the grace: if its key were
  freed before the thread ends, another worker would run it at the same time.

``full``, ``blackhole`` and ``slow`` run without kills, broker restart or
outage, so every duplicate effect they leave is their own; ``rolling`` has
no broker or store fault. SQLite has no server and no link, so only
``classic`` and ``rolling`` fit it.
"""

from __future__ import annotations

import contextlib

from tests.chaos.transactional import TRANSACTIONAL, server_kind
from tests.proxy import TcpProxy
from tests.servers import free_port

CLASSIC = "classic"
FULL = "full"
BLACKHOLE = "blackhole"
SLOW = "slow"
ROLLING = "rolling"
FAULTS = (CLASSIC, FULL, BLACKHOLE, SLOW, ROLLING)
STALLED_SLOT = 0  # the worker whose link to the store is blackholed
SLOW_BURST = 4  # a slow run publishes this many times as fast as the others
# Replicated Redis stores: their classic run fails the primary over instead of
# stopping the store (see tests.chaos.servers.PrivateRedisTopology).
REPLICATED_REDIS = ("redis-cluster", "redis-sentinel")


def fits(fault: str, store: str) -> bool:
    """Whether ``fault`` can be injected into a run of ``store``."""
    kind = server_kind(store)
    if fault == ROLLING:
        # Transactional mode's handler writes through the key's async transaction.
        return store != TRANSACTIONAL
    if fault == CLASSIC:
        return True
    if kind in REPLICATED_REDIS:
        return False  # the links are the cluster's or the sentinels': no one port to proxy
    if fault == FULL:
        return kind == "redis"
    return kind != "sqlite"


async def proxy_to(
    target_port: int, stack: contextlib.AsyncExitStack, delay: float = 0.0
) -> TcpProxy:
    """A started proxy to ``target_port`` on a free port, closed when ``stack`` unwinds."""
    proxy = await TcpProxy(target_port, free_port(), delay=delay).start()
    stack.push_async_callback(proxy.close)
    return proxy
