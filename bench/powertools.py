"""Powertools for AWS Lambda's idempotency utility on the same DynamoDB-compatible server.

``python -m bench.powertools ENDPOINT TABLE TAG CALLS`` runs a no-op
``idempotent_function`` ``CALLS`` times with new keys, one call at a time (as
a Lambda runs it), and prints ``{"calls": ..., "seconds": ...}``. Like semel,
each call claims the key (a conditional ``PutItem``) and completes it (an
``UpdateItem``). It is a child process, so it has a GIL of its own and the
benchmark's event loop is not blocked; the client's connection is warmed
up before the timing starts.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import boto3
import orjson
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

from bench.broker import body

WARM_UP = 20  # calls before the timing starts: connection set-up is not measured


def create_table(client: Any, table: str) -> None:
    """Powertools' documented table: a string partition key ``id``."""
    if table in client.list_tables()["TableNames"]:
        return
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName=table)


def measure(endpoint: str, table: str, tag: str, calls: int) -> float:
    """Seconds for ``calls`` idempotent calls with new keys."""
    client = boto3.session.Session().client("dynamodb", endpoint_url=endpoint)
    create_table(client, table)
    layer = DynamoDBPersistenceLayer(table_name=table, boto3_client=client)
    config = IdempotencyConfig(event_key_jmespath="order_id")

    def noop(order: dict[str, Any]) -> None:
        return None

    idempotent = idempotent_function(
        data_keyword_argument="order", persistence_store=layer, config=config
    )
    handle: Callable[..., None] = idempotent(noop)

    def order(index: int) -> dict[str, Any]:
        event: dict[str, Any] = orjson.loads(body(index))
        return event | {"order_id": f"{tag}-{index}"}

    orders = [order(index) for index in range(calls)]
    with warnings.catch_warnings():
        # Outside Lambda there is no remaining time to read; Powertools warns on every call.
        warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
        for index in range(WARM_UP):
            handle(order=order(calls + index))
        started = time.perf_counter()
        for event in orders:
            handle(order=event)
        return time.perf_counter() - started


def main() -> None:
    endpoint, table, tag, calls = sys.argv[1:5]
    seconds = measure(endpoint, table, tag, int(calls))
    sys.stdout.write(orjson.dumps({"calls": int(calls), "seconds": seconds}).decode() + "\n")


if __name__ == "__main__":
    main()
