"""The DynamoDB table semel keeps its records in, and ``semel migrate`` for it.

Operators who create the table themselves find the same definition in
``deploy/`` (a test keeps them equal)::

    aws dynamodb create-table --cli-input-json file://deploy/dynamodb-table.json
    aws dynamodb wait table-exists --table-name semel_keys
    aws dynamodb update-time-to-live --cli-input-json file://deploy/dynamodb-ttl.json

(``--table-name`` on the command line overrides the name in the files.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Protocol, TypeVar

from botocore.exceptions import ClientError

from stores.dynamodb_items import PARTITION_KEY, TTL_ATTRIBUTE
from stores.errors import StoreUnavailable

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.literals import BillingModeType
    from mypy_boto3_dynamodb.type_defs import (
        AttributeDefinitionTypeDef,
        KeySchemaElementTypeDef,
        TimeToLiveSpecificationTypeDef,
    )

T = TypeVar("T")

KEY_SCHEMA: list[KeySchemaElementTypeDef] = [{"AttributeName": PARTITION_KEY, "KeyType": "HASH"}]
ATTRIBUTE_DEFINITIONS: list[AttributeDefinitionTypeDef] = [
    {"AttributeName": PARTITION_KEY, "AttributeType": "S"}
]
BILLING_MODE: BillingModeType = "PAY_PER_REQUEST"
TTL_SPECIFICATION: TimeToLiveSpecificationTypeDef = {
    "Enabled": True,
    "AttributeName": TTL_ATTRIBUTE,
}

ACTIVE_DEADLINE = 60.0
NO_TTL_WARNING = (
    "this DynamoDB server has no TTL API: expired keys are ignored by semel but never deleted"
)
# What a server without the TTL API answers (dynalite: UnknownOperationException).
NO_TTL_API = frozenset({"UnknownOperationException", "UnknownOperation"})
NOT_FOUND = frozenset({"ResourceNotFoundException"})
IN_USE = frozenset({"ResourceInUseException"})


class Call(Protocol):
    """The store's way to run one client call: off the loop, outages mapped."""

    def __call__(
        self, request: Callable[[], T], *, answers: frozenset[str] = ...
    ) -> Awaitable[T]: ...


async def migrate(client: DynamoDBClient, table: str, call: Call) -> list[str]:
    """Create the table and turn TTL on, unless done; the warnings for the operator."""
    await ensure_table(client, table, call)
    return await ensure_ttl(client, table, call)


async def ensure_table(client: DynamoDBClient, table: str, call: Call) -> None:
    describe = partial(client.describe_table, TableName=table)
    try:
        await call(describe, answers=NOT_FOUND)
    except ClientError:
        create = partial(
            client.create_table,
            TableName=table,
            KeySchema=KEY_SCHEMA,
            AttributeDefinitions=ATTRIBUTE_DEFINITIONS,
            BillingMode=BILLING_MODE,
        )
        # Another migrate creating it first is just as good.
        with contextlib.suppress(ClientError):
            await call(create, answers=IN_USE)
    deadline = time.monotonic() + ACTIVE_DEADLINE
    while (await call(describe))["Table"].get("TableStatus") != "ACTIVE":
        if time.monotonic() > deadline:
            raise StoreUnavailable("dynamodb", f"table {table} not ACTIVE after {ACTIVE_DEADLINE}s")
        await asyncio.sleep(0.2)


async def ensure_ttl(client: DynamoDBClient, table: str, call: Call) -> list[str]:
    """Turn TTL on for the expiry attribute; a server without the API only earns a warning.

    Looking first matters: AWS refuses to enable TTL that is already enabled.
    """
    try:
        described = await call(
            partial(client.describe_time_to_live, TableName=table), answers=NO_TTL_API
        )
    except ClientError:
        return [NO_TTL_WARNING]
    current = described["TimeToLiveDescription"]
    if current.get("TimeToLiveStatus") in ("ENABLED", "ENABLING"):
        attribute = current.get("AttributeName")
        if attribute == TTL_ATTRIBUTE:
            return []
        return [
            f"TTL of table {table} is on attribute {attribute!r}, not {TTL_ATTRIBUTE!r}: "
            "expired keys are ignored by semel but never deleted; turn that TTL off "
            "and run migrate again"
        ]
    update = partial(
        client.update_time_to_live, TableName=table, TimeToLiveSpecification=TTL_SPECIFICATION
    )
    try:
        await call(update, answers=NO_TTL_API)
    except ClientError:
        return [NO_TTL_WARNING]
    return []
