"""One OS process calling an idempotent function: ``python -m tests.idempotent.caller
SETTINGS_JSON KEY MODE``.

It opens the store, says ``ready``, and calls once ``go`` comes on stdin, so
that the test releases every process together. The function appends
``started`` and ``charged`` to the ledger beside the store, each with its
fence. Modes: ``run`` (the decorated function), ``hang`` (decorated, says
``started <fence>`` and never ends: for a SIGKILL), ``unguarded`` (the same
body without the decorator: what the proof must catch).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import orjson

from semel.consumer.idempotent import idempotent
from semel.settings import Settings
from semel.stores.base import Store
from tests.conftest import open_store
from tests.idempotent.ledger import open_ledger


async def main(settings: Settings, key: str, mode: str) -> dict[str, Any]:
    store = await open_store(settings)
    ledger = await open_ledger(settings)

    async def store_for(_: float | None) -> Store:
        return store

    async def charge(order_id: str, *, fence: int = 0) -> dict[str, Any]:
        pid = os.getpid()
        await ledger.append({"step": "started", "key": order_id, "fence": fence, "pid": pid})
        if mode == "hang":
            print(f"started {fence}", flush=True)
            await asyncio.Event().wait()
        await ledger.append({"step": "charged", "key": order_id, "fence": fence, "pid": pid})
        return {"fence": fence, "pid": pid}

    guarded = idempotent(
        store_for, key="order_id", in_progress="wait", wait_timeout=30, scope="charge"
    )(charge)
    try:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        return await (charge(key) if mode == "unguarded" else guarded(key))
    finally:
        await ledger.close()
        await store.close()


if __name__ == "__main__":
    settings_json, key, mode = sys.argv[1:4]
    result = asyncio.run(main(Settings.model_validate_json(settings_json), key, mode))
    print(f"result {orjson.dumps(result).decode()}", flush=True)
