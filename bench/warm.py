"""``python -m bench.warm``: duplicates a running worker has seen before, on Redis.

``python -m bench``'s duplicates drain starts a new consumer, whose cache of
completed keys (``SEMEL_COMPLETED_CACHE_SIZE``) is empty: every copy asks the
store. Here one consumer process drains N new keys (not timed), is stopped
with SIGSTOP while the same N messages are published again, and the second
drain is timed after SIGCONT. The bare aio-pika baseline, semel with the cache
off and semel with it on are measured that way, one after the other in each
repeat, and printed as medians with their ratio to the baseline and the
consumer's CPU per message.

    .venv/bin/python -m bench.warm --messages 20000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
from pathlib import Path

from bench.backends import Backends
from bench.broker import Batch, Broker
from bench.children import Group, start_baseline, start_semel

LOGS = Path("bench/out/warm-logs")  # a consumer's log is kept only when it failed


async def warm_drain(broker: Broker, backends: Backends, kind: str, n: int) -> tuple[float, float]:
    size = {"baseline": 0, "semel-cache-off": 0, "semel-cache-on": 100_000}[kind]
    settings = backends.settings("redis", f"warm-{kind}")
    settings = settings.model_copy(update={"completed_cache_size": size})
    await broker.declare(settings)
    if kind != "baseline":
        await backends.migrate(settings)
    start = start_baseline if kind == "baseline" else start_semel
    child = start(settings.queue, settings, LOGS)
    group = Group([child])
    try:
        # Until the consumer's AMQP socket is open, then a second for its consume.
        for _ in range(400):
            if group.children[0].amqp_ports():
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        batch = Batch("k", n)
        await broker.publish(settings.exchange, batch)
        await broker.time_drain(settings.queue, n, group, strict=False)  # untimed: unique keys
        child.process.send_signal(signal.SIGSTOP)
        try:
            await broker.publish(settings.exchange, batch)  # the same keys again
            last = -1
            while (ready := await broker.ready(settings.queue)) != last:
                last = ready
                await asyncio.sleep(0.3)
            timing = asyncio.create_task(broker.time_drain(settings.queue, ready, group))
            await asyncio.sleep(0.05)
        finally:
            child.process.send_signal(signal.SIGCONT)
        drain = await timing
        return n / drain.seconds, drain.cpu_seconds / n * 1e6
    finally:
        codes = group.stop()
        left = await broker.leftovers(settings)
        await broker.delete(settings)
        if any(codes) or left:
            print(f"  {kind}: exit {codes}, left {left}; log {child.log}")
        else:
            child.discard_log()


async def main(n: int, repeat: int) -> None:
    kinds = ["baseline", "semel-cache-off", "semel-cache-on"]
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    cpus: dict[str, list[float]] = {k: [] for k in kinds}
    with Backends(["redis"]) as backends:
        broker = await Broker.open()
        try:
            for index in range(repeat):
                for kind in kinds:
                    rate, cpu = await warm_drain(broker, backends, kind, n)
                    rates[kind].append(rate)
                    cpus[kind].append(cpu)
                    print(f"run {index + 1} {kind}: {rate:,.0f} msg/s, {cpu:.0f} CPU us/msg")
        finally:
            await broker.close()
    base = statistics.median(rates["baseline"])
    for kind in kinds:
        med = statistics.median(rates[kind])
        runs = [round(r) for r in rates[kind]]
        print(
            f"{kind:16} median {med:8,.0f} msg/s  ratio {med / base:.2f}  "
            f"CPU {statistics.median(cpus[kind]):.0f} us/msg  runs {runs}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.warm", description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000, help="keys per drain (20,000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each case (5)")
    options = parser.parse_args()
    asyncio.run(main(options.messages, options.repeat))
