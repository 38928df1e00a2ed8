"""examples/fastapi_idempotency.py against the real Redis, through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest

from examples import fastapi_idempotency as example

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def client(redis_server: str) -> AsyncIterator[httpx.AsyncClient]:
    assert example.engine.settings.redis_url.removeprefix("redis://").endswith(":6379/0")
    transport = httpx.ASGITransport(app=example.app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://payments") as client:
            yield client
    finally:
        await example.engine.close()


@dataclass
class GatedPsp(example.Psp):
    """Holds every charge until ``gate`` opens; ``inside`` once one is waiting."""

    inside: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def charge(self, key: str, amount: int, *, fence: int) -> str:
        self.inside.set()
        await self.gate.wait()
        return await super().charge(key, amount, fence=fence)


def keyed(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key}


async def test_a_repeated_request_gets_the_stored_receipt(client: httpx.AsyncClient) -> None:
    key = uuid.uuid4().hex
    first = await client.post("/payments", json={"amount": 1250}, headers=keyed(key))
    again = await client.post("/payments", json={"amount": 1250}, headers=keyed(key))
    assert first.status_code == again.status_code == 201, first.text
    assert first.json()["replayed"] is False
    assert again.json() == {**first.json(), "replayed": True}
    assert [charge[0] for charge in example.psp.charges].count(key) == 1


async def test_concurrent_copies_charge_once(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    psp = GatedPsp()
    monkeypatch.setattr(example, "psp", psp)
    key = uuid.uuid4().hex
    body = {"amount": 700, "currency": "USD"}
    first = asyncio.create_task(client.post("/payments", json=body, headers=keyed(key)))
    await psp.inside.wait()
    copies = await asyncio.gather(
        *(client.post("/payments", json=body, headers=keyed(key)) for _ in range(3))
    )
    assert [copy.status_code for copy in copies] == [409] * 3
    assert all(1 <= int(copy.headers["Retry-After"]) <= 30 for copy in copies)
    psp.gate.set()
    assert (await first).status_code == 201
    late = await client.post("/payments", json=body, headers=keyed(key))
    assert late.json()["replayed"] is True
    assert len(psp.charges) == 1


async def test_a_key_reused_with_another_body_is_refused(client: httpx.AsyncClient) -> None:
    key = uuid.uuid4().hex
    assert (await client.post("/payments", json={"amount": 5}, headers=keyed(key))).is_success
    other = await client.post("/payments", json={"amount": 6}, headers=keyed(key))
    assert other.status_code == 422
    assert "another body" in other.json()["detail"]
