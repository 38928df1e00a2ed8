"""The DynamoDB table semel keeps its records in, ``semel migrate`` for it, and
what the server's errors say about it (:func:`store_error`).

Operators who create the table themselves find the same definition in
``deploy/`` (a test keeps them equal)::

    aws dynamodb create-table --cli-input-json file://deploy/dynamodb-table.json
    aws dynamodb wait table-exists --table-name semel_keys
    aws dynamodb update-time-to-live --cli-input-json file://deploy/dynamodb-ttl.json

(``--table-name`` on the command line overrides the name in the files.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Protocol, TypeVar

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from semel.stores.dynamodb.items import PARTITION_KEY, TTL_ATTRIBUTE
from semel.stores.errors import KeyRefused, StoreError, StoreMisconfigured, StoreUnavailable

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.literals import BillingModeType
    from mypy_boto3_dynamodb.type_defs import (
        AttributeDefinitionTypeDef,
        KeySchemaElementTypeDef,
        TimeToLiveSpecificationTypeDef,
    )

T = TypeVar("T")

BACKEND = "dynamodb"
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

# What the server's errors mean for semel (the contract in semel/stores/base.py). These
# pass, and the client has retried them already: throttling, the server's own trouble.
# Any code not named in this block is taken for one of them too: the consumer
# waits for the store and loses nothing.
TRANSIENT = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "LimitExceededException",  # too many control-plane calls at once (migrate)
        "InternalServerError",
        "ServiceUnavailable",
    }
)
# Reachable, not set up for semel: credentials or permissions the server refuses.
DENIED = frozenset(
    {
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "IncompleteSignatureException",
        "MissingAuthenticationTokenException",
    }
)
# A ValidationException about one item: that key alone cannot be held.
ITEM_LIMITS = ("item size", "size of hashkey")
# A ValidationException about the table's key: a table that is not semel's.
OTHER_KEY_SCHEMA = ("does not match the schema", "missing the key", "type mismatch for key")
# Errors about the request itself: bugs, which must not pass for outages.
REQUEST_ERRORS = frozenset({"ValidationException", "SerializationException"})


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
    except ClientError as exc:
        if code_of(exc) not in NOT_FOUND:
            raise  # a bug in the request, not a missing table
        create = partial(
            client.create_table,
            TableName=table,
            KeySchema=KEY_SCHEMA,
            AttributeDefinitions=ATTRIBUTE_DEFINITIONS,
            BillingMode=BILLING_MODE,
        )
        try:
            await call(create, answers=IN_USE)
        except ClientError as exc:
            if code_of(exc) not in IN_USE:  # another migrate creating it first is as good
                raise
    deadline = time.monotonic() + ACTIVE_DEADLINE
    while (await call(describe))["Table"].get("TableStatus") != "ACTIVE":
        if time.monotonic() > deadline:
            raise StoreUnavailable(BACKEND, f"table {table} not ACTIVE after {ACTIVE_DEADLINE}s")
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


def code_of(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


def store_error(exc: ClientError, table: str, key: str | None = None) -> StoreError | None:
    """What the server's answer ``exc`` means for semel, or ``None`` for a bug in the
    request (raised as it is); ``key`` is the one key the request was about."""
    code, message = code_of(exc), exc.response.get("Error", {}).get("Message", "")
    if code in REQUEST_ERRORS:
        said = message.lower()
        if any(part in said for part in OTHER_KEY_SCHEMA):
            return StoreMisconfigured(
                f"DynamoDB table {table!r} is not keyed on a string {PARTITION_KEY!r}, as "
                f"`semel migrate` creates it: {message}"
            )
        if key is not None and any(part in said for part in ITEM_LIMITS):
            return KeyRefused(key, f"DynamoDB's item limits: {message}")
        return None
    if code in NOT_FOUND:
        return StoreMisconfigured(
            f"DynamoDB table {table!r} does not exist: run `semel migrate` ({message})"
        )
    if code in DENIED:
        return StoreMisconfigured(
            f"DynamoDB refuses semel's credentials or permissions on table {table!r}: "
            f"{code}: {message}"
        )
    return StoreUnavailable(BACKEND, str(exc))


def failure_error(exc: BotoCoreError) -> StoreError:
    """What a failure on the client's side means: no credentials to sign with, or an outage
    (the endpoint unreachable, a connect or read timeout, a connection cut)."""
    if isinstance(exc, NoCredentialsError):
        return StoreMisconfigured(f"DynamoDB: {exc}: set AWS credentials for semel")
    return StoreUnavailable(BACKEND, f"{type(exc).__name__}: {exc}")
