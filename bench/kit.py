"""``python -m bench.kit``: what the testing kit costs per message, against calling the
handler directly.

The baseline calls an async handler with a :func:`semel.consumer.testing.context`;
the kit sends the same messages through the real pipeline on its in-memory
SQLite store. Both run in this process, one after the other, ``--repeat``
times; the medians and their ratio are printed.

    .venv/bin/python -m bench.kit --messages 500 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from semel.consumer import Context
from semel.consumer.testing import HandlerKit, context


async def handler(ctx: Context) -> dict[str, Any]:
    return {"n": ctx.body["n"]}


async def direct(messages: int) -> float:
    began = time.perf_counter()
    for n in range(messages):
        await handler(context({"n": n}, key=f"k-{n}"))
    return (time.perf_counter() - began) / messages


async def through_the_kit(messages: int) -> float:
    async with HandlerKit(handler) as kit:
        began = time.perf_counter()
        for n in range(messages):
            if not (await kit.send({"n": n}, key=f"k-{n}")).acked:
                raise RuntimeError(f"message {n} was not acked")
        return (time.perf_counter() - began) / messages


async def measure(messages: int, repeat: int) -> tuple[float, float]:
    baseline, kit = [], []
    for _ in range(repeat):
        baseline.append(await direct(messages))
        kit.append(await through_the_kit(messages))
    return statistics.median(baseline), statistics.median(kit)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.kit", description=__doc__)
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    baseline, kit = asyncio.run(measure(args.messages, args.repeat))
    print(f"handler called directly: {baseline * 1e6:.1f} µs per message (baseline)")
    print(f"through the testing kit: {kit * 1e3:.2f} ms per message, {kit / baseline:.0f}x")


if __name__ == "__main__":
    main()
