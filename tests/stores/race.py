"""Many claimers of the same keys at once, spread over several OS processes."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from collections.abc import Sequence
from multiprocessing.synchronize import Barrier
from typing import TypeVar

from semel.settings import Settings
from semel.stores.base import ClaimRequest, Outcome
from semel.stores.errors import KeyRefused
from tests.conftest import open_store

Outcomes = dict[str, list[tuple[str, int]]]
T = TypeVar("T")


def decided(answers: Sequence[T | KeyRefused]) -> list[T]:
    """A batch's answers, none of them a refusal: no key of these tests is refused."""
    assert not any(isinstance(answer, KeyRefused) for answer in answers), answers
    return [answer for answer in answers if not isinstance(answer, KeyRefused)]


async def _claim_all(
    settings: Settings, keys: list[str], claimers: int, go: Barrier, batch: bool
) -> Outcomes:
    store = await open_store(settings)
    try:
        # Every process has its connections open before anyone claims.
        await asyncio.to_thread(go.wait, 60)
        if batch:  # each claimer asks for every key in one claim_many
            requests = [ClaimRequest(key, "f" * 64) for key in keys]
            batches = (store.claim_many(requests) for _ in range(claimers))
            answers = [decided(a) for a in await asyncio.gather(*batches)]
            return {
                key: [(str(a[i].outcome), a[i].fence) for a in answers]
                for i, key in enumerate(keys)
            }
        tasks = {
            key: [asyncio.create_task(store.claim(key, "f" * 64)) for _ in range(claimers)]
            for key in keys
        }
        return {
            key: [(str(c.outcome), c.fence) for c in await asyncio.gather(*ts)]
            for key, ts in tasks.items()
        }
    finally:
        await store.close()


def _worker(
    settings_json: str,
    keys: list[str],
    claimers: int,
    go: Barrier,
    out: mp.Queue,  # type: ignore[type-arg]
    batch: bool,
) -> None:
    settings = Settings.model_validate_json(settings_json)
    out.put(asyncio.run(_claim_all(settings, keys, claimers, go, batch)))


def race_claims(
    settings: Settings, keys: list[str], processes: int, claimers: int, batch: bool = False
) -> Outcomes:
    """Start ``processes`` processes of ``claimers`` claimers each per key, released together."""
    ctx = mp.get_context("spawn")
    go = ctx.Barrier(processes)
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [
        ctx.Process(
            target=_worker, args=(settings.model_dump_json(), keys, claimers, go, out, batch)
        )
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    merged: Outcomes = {key: [] for key in keys}
    for _ in procs:
        for key, results in out.get(timeout=60).items():
            merged[key].extend(results)
    for proc in procs:
        proc.join(10)
    return merged


async def assert_one_winner_per_key(settings: Settings, batch: bool = False) -> None:
    """20 keys, 2 OS processes x 25 concurrent claimers per key: one winner each.

    With ``batch`` every claimer claims all 20 keys in one ``claim_many``.
    """
    store = await open_store(settings)
    try:
        await store.migrate()
    finally:
        await store.close()
    keys = [f"race-{i}" for i in range(20)]
    outcomes = await asyncio.to_thread(
        race_claims, settings, keys, processes=2, claimers=25, batch=batch
    )
    for key in keys:
        won = [fence for outcome, fence in outcomes[key] if outcome == Outcome.CLAIMED]
        assert len(outcomes[key]) == 50
        assert len(won) == 1, f"{key}: {len(won)} winners"
        # A claimer that meets a held key answers "in progress"; none waits.
        assert {o for o, _ in outcomes[key]} <= {Outcome.CLAIMED, Outcome.IN_PROGRESS}
