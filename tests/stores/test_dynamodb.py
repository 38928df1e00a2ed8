"""DynamoDB-only checks: both claim paths, TTL set-up, the item size limit and deploy/."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any, cast

import boto3
import pytest

from semel.settings import Settings
from semel.stores.base import Claim, Outcome, Status, Store
from semel.stores.dynamodb import table as dynamodb_table
from semel.stores.dynamodb.items import TTL_ATTRIBUTE, Instant, Item, decide, number, string
from semel.stores.dynamodb.store import RESULT_LIMIT, DynamoDBStore
from semel.stores.errors import ResultTooLarge, StoreMisconfigured
from tests.conftest import SettingsFactory, StoreFactory, open_store
from tests.fences import clock_us, started_fresh

both_servers = pytest.mark.parametrize("backend", ["dynamodb-moto", "dynamodb-dynalite"])
pytestmark = pytest.mark.timeout(60)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
FP = "f" * 64


def sent_operations(store: Store) -> list[str]:
    """The DynamoDB operations ``store`` sends from now on (one per round trip)."""
    sent: list[str] = []
    dynamodb = cast(DynamoDBStore, store)
    send = dynamodb._send

    async def record(operation: str, request: dict[str, Any]) -> dict[str, Any]:
        sent.append(operation)
        return await send(operation, request)

    dynamodb._send = record
    return sent


@both_servers
async def test_refused_claim_reads_again_only_where_the_server_keeps_the_item(
    make_store: StoreFactory, backend: str
) -> None:
    store = await make_store()
    sent = sent_operations(store)
    first = await store.claim("k", FP)
    assert first.outcome is Outcome.CLAIMED
    assert sent == ["PutItem"]  # a new key: its first item, written on "none exists"

    sent.clear()
    held = await store.claim("k", FP)
    assert held.outcome is Outcome.IN_PROGRESS
    assert held.fence == first.fence
    # moto returns the item a failed condition met; dynalite does not, so one consistent read.
    assert sent == (["PutItem"] if backend == "dynamodb-moto" else ["PutItem", "GetItem"])

    # A lapsed lease is taken over by one UpdateItem more, after the refused PutItem.
    assert await store.release("k", first.fence)
    sent.clear()
    again = await store.claim("k", FP)
    assert (again.outcome, again.record.claims) == (Outcome.CLAIMED, 2)
    assert again.fence == first.fence + 1
    read = [] if backend == "dynamodb-moto" else ["GetItem"]
    assert sent == ["PutItem", *read, "UpdateItem"]


@both_servers
async def test_migrate_warns_only_where_there_is_no_ttl_api(
    make_store: StoreFactory, make_settings: SettingsFactory, backend: str
) -> None:
    store = await make_store()
    warnings = await store.migrate()
    if backend == "dynamodb-dynalite":
        assert warnings == [dynamodb_table.NO_TTL_WARNING]
        return
    assert warnings == []
    settings = make_settings()
    client = boto3.client(
        "dynamodb",
        endpoint_url=settings.dynamodb_endpoint_url,
        region_name=settings.dynamodb_region,
    )
    try:
        ttl = client.describe_time_to_live(TableName=settings.dynamodb_table)
    finally:
        client.close()
    description = ttl["TimeToLiveDescription"]
    assert description.get("TimeToLiveStatus") == "ENABLED"
    assert description.get("AttributeName") == TTL_ATTRIBUTE


@both_servers
async def test_result_past_the_limit_is_refused_whole_and_writes_nothing(
    make_store: StoreFactory,
) -> None:
    store = await make_store()
    claim = await store.claim("k", FP)
    before = await store.get("k")
    with pytest.raises(ResultTooLarge):
        await store.complete("k", claim.fence, {"blob": "x" * RESULT_LIMIT})
    assert await store.get("k") == before

    # Just under the limit still fits in one item, with the record around it.
    fits = {"blob": "x" * (RESULT_LIMIT - 100)}
    assert await store.complete("k", claim.fence, fits)
    dup = await store.claim("k", FP)
    assert (dup.outcome, dup.record.result) == (Outcome.DUPLICATE, fits)


@both_servers
async def test_record_past_retention_is_absent_and_replaced_with_a_higher_fence(
    make_store: StoreFactory,
) -> None:
    store = await make_store(retention=1.0, lock_ttl=0.5)
    since = clock_us()
    first = await store.claim("k", FP)
    assert started_fresh(first.fence, since)
    assert await store.complete("k", first.fence, {"v": 1})
    end = time.monotonic() + 5
    while await store.get("k") is not None:
        assert time.monotonic() < end, "retention never passed"
        await asyncio.sleep(0.1)

    again = await store.claim("k", FP)
    assert again.outcome is Outcome.CLAIMED
    # Over the old item: the clock now, well past the old fence + 1.
    assert again.fence > first.fence + 1
    assert started_fresh(again.fence, since)
    assert again.record.claims == 1
    assert not await store.complete("k", first.fence, {"stale": True})


@both_servers
async def test_a_repeated_finish_is_not_a_lost_fence(make_store: StoreFactory) -> None:
    # botocore repeats a write whose answer was lost; the repeat must not read as "taken over".
    store = await make_store()
    claim = await store.claim("k", FP)
    assert await store.complete("k", claim.fence, {"n": 1})
    assert await store.complete("k", claim.fence, {"n": 1})
    assert not await store.complete("k", claim.fence, {"n": 2})
    assert not await store.fail("k", claim.fence, "late")
    assert not await store.release("k", claim.fence)

    other = await store.claim("other", FP)
    assert await store.fail("other", other.fence, "boom")
    assert await store.fail("other", other.fence, "boom")
    record = await store.get("other")
    assert record is not None
    assert (record.status, record.error) == (Status.FAILED, "boom")


def test_a_repeated_claim_write_is_recognised_as_ours() -> None:
    now = Instant.now()
    held: Item = {
        "fingerprint": string(FP),
        "status": string(Status.IN_PROGRESS),
        "claim_token": string("mine"),
        "claims": number(1),
        "lease_expires_at": number(now.ms + 30_000),
        TTL_ATTRIBUTE: number(now.whole_seconds + 60),
    }
    mine = decide("k", held, FP, "mine", now, max_claims=10)
    theirs = decide("k", held, FP, "theirs", now, max_claims=10)
    assert isinstance(mine, Claim)
    assert isinstance(theirs, Claim)
    assert (mine.outcome, theirs.outcome) == (Outcome.CLAIMED, Outcome.IN_PROGRESS)


@both_servers
async def test_missing_table_is_misconfigured(make_settings: SettingsFactory) -> None:
    store = await open_store(make_settings(dynamodb_table="semel_never_migrated"))
    try:
        with pytest.raises(StoreMisconfigured) as info:
            await store.claim("k", FP)
        assert "semel_never_migrated" in str(info.value)
        assert "semel migrate" in str(info.value)
        with pytest.raises(StoreMisconfigured):
            await store.ping()
    finally:
        await store.close()


async def test_deploy_files_create_the_table_migrate_would(moto_endpoint: str) -> None:
    table = json.loads((DEPLOY / "dynamodb-table.json").read_text())
    ttl = json.loads((DEPLOY / "dynamodb-ttl.json").read_text())
    assert table["TableName"] == ttl["TableName"] == Settings().dynamodb_table
    assert table["KeySchema"] == dynamodb_table.KEY_SCHEMA
    assert table["AttributeDefinitions"] == dynamodb_table.ATTRIBUTE_DEFINITIONS
    assert table["BillingMode"] == dynamodb_table.BILLING_MODE
    assert ttl["TimeToLiveSpecification"] == dynamodb_table.TTL_SPECIFICATION

    name = f"semel_deploy_{uuid.uuid4().hex[:8]}"
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    try:
        client.create_table(**(table | {"TableName": name}))
        client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1})
        client.update_time_to_live(**(ttl | {"TableName": name}))
    finally:
        client.close()

    settings = Settings(store="dynamodb", dynamodb_endpoint_url=moto_endpoint, dynamodb_table=name)
    store = await open_store(settings)
    try:
        assert await store.migrate() == []  # nothing left to create or turn on
        assert (await store.claim("k", FP)).outcome is Outcome.CLAIMED
    finally:
        await store.close()
