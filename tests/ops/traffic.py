"""Traffic for the end-to-end operations tests, and a consumer process to send it to."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from semel.settings import Settings
from tests.consumer.harness import Broker, ConsumerProcess, eventually
from tests.ops.conftest import Samples, http, scrape

BODY_MARKER = "do-not-log-this-body"  # in every body; must never reach an info log


@dataclass(frozen=True)
class Traffic:
    """``unique`` new keys, ``retried`` keys that fail their first attempt,
    ``bad`` malformed bodies, then ``duplicates`` of the first unique keys."""

    unique: int
    retried: int
    bad: int
    duplicates: int

    @property
    def processed(self) -> int:
        return self.unique + self.retried


async def send_originals(broker: Broker, settings: Settings, traffic: Traffic) -> None:
    for n in range(traffic.unique):
        await broker.publish(settings, {"n": n, "note": BODY_MARKER}, key=f"u-{n}")
    for n in range(traffic.retried):
        await broker.publish(settings, {"fail_until": 1, "note": BODY_MARKER}, key=f"r-{n}")
    for n in range(traffic.bad):
        await broker.publish(settings, f"{{{BODY_MARKER}".encode(), key=f"bad-{n}")


async def send_duplicates(broker: Broker, settings: Settings, traffic: Traffic) -> None:
    for n in range(traffic.duplicates):
        await broker.publish(settings, {"n": n, "note": BODY_MARKER}, key=f"u-{n}")


async def started(settings: Settings, log: Path) -> ConsumerProcess:
    """``python -m semel`` with ``settings``, once its endpoint says it is ready."""
    worker = ConsumerProcess(settings, log).start()

    async def ready() -> bool:
        if worker.exited() is not None:
            raise AssertionError(f"consumer exited early:\n{worker.output()}")
        try:
            return (await http(settings.metrics_port, "/readyz")).status == 200
        except OSError:
            return False  # not listening yet

    await eventually(ready, 30, "consumer ready")
    return worker


async def scraped_until(port: int, check: str, expected: dict[tuple[str, str], float]) -> Samples:
    """Scrape until the ``semel_messages_total`` outcomes reach ``expected``."""
    last: list[Samples] = []

    async def reached() -> bool:
        last[:] = [await scrape(port)]
        return all(last[0].messages(*labels) >= n for labels, n in expected.items())

    await eventually(reached, 30, check)
    return last[0]
