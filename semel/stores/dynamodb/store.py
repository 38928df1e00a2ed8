"""The DynamoDB idempotency store: one conditional write per claim, one per completion.

A new key is claimed by a conditional PutItem of its first item, the cheapest
write for the server; a completion is a fenced UpdateItem that returns nothing.
A refused write gets the item it collided with in the same call
(``ReturnValuesOnConditionCheckFailure=ALL_OLD``); only a server that does not
return it (dynalite) costs one consistent GetItem more. The item layout, the
writes and the claim decision live in :mod:`semel.stores.dynamodb.items`, the table
and its TTL in :mod:`semel.stores.dynamodb.table`.

The calls made per delivery (claims, completions, leases, reads) go through
:mod:`semel.stores.dynamodb.wire`, DynamoDB's JSON protocol spoken on the
event loop, for a fraction of botocore's CPU (``python -m bench.store_only``
compares the two). boto3 keeps the control plane
(``migrate``) and the endpoint, region and credentials it resolves, on a
private thread pool because it blocks; it carries the data plane too where
the endpoint is reached through a proxy, or where ``open_store`` is asked to.
Both answer with botocore's exceptions: what fails after the retries is
sorted into the contract's errors by
:func:`semel.stores.dynamodb.table.store_error`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar, cast

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.httpsession import get_cert_path
from botocore.utils import get_environ_proxies

from semel.stores.base import Claim, Completion, Outcome, Record, Status, Store, StoreConfig
from semel.stores.dynamodb import items
from semel.stores.dynamodb import table as dynamodb_table
from semel.stores.dynamodb.items import Instant, Item, Step, Update
from semel.stores.dynamodb.table import BACKEND
from semel.stores.dynamodb.wire import open_data_plane
from semel.stores.errors import StoreUnavailable

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.literals import ReturnValueType as ReturnValue

T = TypeVar("T")
# One DynamoDB operation by name, its request and its answer as DynamoDB's JSON has them.
Send = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
DataPlaneClient = Literal["lean", "botocore"]

# An item stops at 400 KB; the rest of the record fits easily in what is left.
RESULT_LIMIT = 350_000
# A dead endpoint surfaces in seconds: short connects and two retries (botocore's
# ``max_attempts`` counts retries; throttling is retried the same way). An answer
# may take longer: a loaded server queues requests but answers them (a local
# DynamoDB-compatible server answering one request at a time takes over ten
# seconds for a burst of a thousand claims on two cores).
CONNECT_TIMEOUT = 2.0
READ_TIMEOUT = 30.0
READ_TIMEOUT_FLOOR = 5.0
MAX_ATTEMPTS = 2
# Each lost round means another writer changed the item meanwhile; this many
# in a row is a storm on one key, and "try again later" is the right answer.
CLAIM_ROUNDS = 8
REFUSED = frozenset({"ConditionalCheckFailedException"})


class DynamoDBStore(Store):
    """Idempotency records as items of one table, keyed by the namespaced key."""

    backend = BACKEND
    result_limit = RESULT_LIMIT

    def __init__(
        self,
        config: StoreConfig,
        client: DynamoDBClient,
        table: str,
        executor: ThreadPoolExecutor,
        send: Send | None = None,
        close: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self._client = client
        self._table = table
        self._executor = executor
        self._send = send or partial(_botocore_send, client, executor)
        self._close_send = close

    async def call(
        self,
        request: Callable[[], T],
        *,
        answers: frozenset[str] = frozenset(),
        key: str | None = None,
    ) -> T:
        """Run one blocking client call off the loop; its failures sorted into store errors.

        A ClientError whose code is in ``answers`` is an answer the caller handles;
        ``key`` is the one key the call is about, refused alone when its item cannot
        be held. A bug in the request is raised as it is.
        """
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, request)
        except (ClientError, BotoCoreError) as exc:
            self._raise_sorted(exc, answers, key)

    async def send(
        self,
        operation: str,
        request: dict[str, Any],
        *,
        answers: frozenset[str] = frozenset(),
        key: str | None = None,
    ) -> dict[str, Any]:
        """One data-plane call, its failures sorted as :meth:`call` sorts them."""
        try:
            return await self._send(operation, request)
        except (ClientError, BotoCoreError) as exc:
            self._raise_sorted(exc, answers, key)

    def _raise_sorted(
        self, exc: ClientError | BotoCoreError, answers: frozenset[str], key: str | None
    ) -> NoReturn:
        """Raise the contract's error ``exc`` stands for; ``exc`` itself when it is none
        (an answer the caller reads, such as a refused condition)."""
        if isinstance(exc, BotoCoreError):
            raise dynamodb_table.failure_error(exc) from exc
        answered = dynamodb_table.code_of(exc) in answers
        error = None if answered else dynamodb_table.store_error(exc, self._table, key)
        if error is None:
            raise exc
        raise error from exc

    def _key(self, key: str) -> Item:
        return {items.PARTITION_KEY: items.string(self.config.namespaced(key))}

    async def _write(
        self, key: str, update: Update, returns: ReturnValue = "NONE"
    ) -> tuple[Item | None, Item | None]:
        """One conditional UpdateItem: ``(new item, None)``, or ``(None, the item it hit)``.

        The new item is ``{}`` unless ``returns`` asks for it; the item it hit is
        ``None`` where the server does not return it (dynalite).
        """
        request = {
            "TableName": self._table,
            "Key": self._key(key),
            "UpdateExpression": update.expression,
            "ConditionExpression": update.condition,
            "ExpressionAttributeNames": update.names,
            "ExpressionAttributeValues": update.values,
            "ReturnValues": returns,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        try:
            response = await self.send("UpdateItem", request, answers=REFUSED, key=key)
        except ClientError as exc:
            return None, _held(exc)
        return response.get("Attributes", {}), None

    async def _put(self, key: str, item: Item, rule: Update) -> tuple[bool, Item | None]:
        """A PutItem on ``rule``'s condition: ``(True, None)``, or ``(False, the item it hit)``."""
        request = {
            "TableName": self._table,
            "Item": item,
            "ConditionExpression": rule.condition,
            "ExpressionAttributeNames": rule.names,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        if rule.values:  # DynamoDB refuses an empty map of values
            request["ExpressionAttributeValues"] = rule.values
        try:
            await self.send("PutItem", request, answers=REFUSED, key=key)
        except ClientError as exc:
            return False, _held(exc)
        return True, None

    async def _update(self, key: str, update: Update) -> bool:
        return (await self._write(key, update))[0] is not None

    async def _read(self, key: str) -> Item | None:
        request = {"TableName": self._table, "Key": self._key(key), "ConsistentRead": True}
        return cast("Item | None", (await self.send("GetItem", request, key=key)).get("Item"))

    async def claim(self, key: str, fingerprint: str) -> Claim:
        """One PutItem for a new key; any other adds a write or two, re-decided on a lost race."""
        # Marks this call's writes, so a write the client repeated is known as ours.
        token = uuid.uuid4().hex
        now = Instant.now()
        pk = self.config.namespaced(key)
        item = items.fresh_item(pk, fingerprint, token, now.us, now, self.config)
        written, held = await self._put(
            key, item, items.update("", items.NEW_CONDITION, now, self.config)
        )
        if written:
            return Claim(Outcome.CLAIMED, items.to_record(key, item))
        for _ in range(CLAIM_ROUNDS):
            if held is None:
                # This server does not return the item a refused write collided with.
                held = await self._read(key)
            if held is not None:
                decided = await self._decide(key, held, fingerprint, token, now)
                if decided is not None:
                    return decided
            # A lapsed lease to take over, or a race lost meanwhile: one UpdateItem decides.
            now = Instant.now()
            claim = items.claim_update(fingerprint, token, now, self.config)
            claimed, held = await self._write(key, claim, "ALL_NEW")
            if claimed is not None:
                return Claim(Outcome.CLAIMED, items.to_record(key, claimed))
        raise StoreUnavailable(BACKEND, f"claim of {key!r} lost {CLAIM_ROUNDS} races in a row")

    async def _decide(
        self, key: str, held: Item, fingerprint: str, token: str, now: Instant
    ) -> Claim | None:
        """The answer to a refused claim, or ``None`` when the claim must be written again."""
        step = items.decide(key, held, fingerprint, token, now, self.config.max_claims)
        if isinstance(step, Claim):
            return step
        fence = items.fence_of(held)
        if step is Step.REPLACE:
            replaced = await self._replace(key, fingerprint, token, fence)
            return None if replaced is None else Claim(Outcome.CLAIMED, replaced)
        if step is Step.POISON:
            poison = items.poison_update(fence, Instant.now(), self.config)
            failed, _ = await self._write(key, poison, "ALL_NEW")
            return None if failed is None else Claim(Outcome.POISON, items.to_record(key, failed))
        return None

    async def _replace(self, key: str, fingerprint: str, token: str, fence: int) -> Record | None:
        """Claim over a record past retention: claims restart at 1, the fence keeps growing,
        to the clock as for a key with no item, or past the old fence if that is higher."""
        now = Instant.now()
        pk = self.config.namespaced(key)
        grown = max(fence + 1, now.us)
        item = items.fresh_item(pk, fingerprint, token, grown, now, self.config)
        rule = items.update("", items.REPLACE_CONDITION, now, self.config, fence=fence)
        written, _ = await self._put(key, item, rule)
        return items.to_record(key, item) if written else None

    async def _finish(
        self, key: str, fence: int, update: Update, status: Status, attribute: str, value: str
    ) -> bool:
        """A fenced completion or failure; a refused one may have met its own earlier
        success (this fence, ``status``, and ``value`` in ``attribute``)."""
        written, held = await self._write(key, update)
        if written is not None:
            return True
        if held is None:
            held = await self._read(key)
        return held is not None and items.finished_as(held, fence, status, attribute, value)

    async def complete_encoded(self, completion: Completion) -> bool:
        # The result is stored as a string attribute: orjson's output is UTF-8.
        data, fence = completion.data.decode(), completion.fence
        update = items.complete_update(fence, data, Instant.now(), self.config)
        return await self._finish(completion.key, fence, update, Status.COMPLETED, "result", data)

    async def release(self, key: str, fence: int) -> bool:
        update = items.release_update(fence, Instant.now(), self.config)
        return await self._update(key, update)

    async def fail(self, key: str, fence: int, error: str) -> bool:
        update = items.fail_update(fence, error, Instant.now(), self.config)
        return await self._finish(key, fence, update, Status.FAILED, "error", error)

    async def heartbeat(self, key: str, fence: int) -> bool:
        update = items.heartbeat_update(fence, Instant.now(), self.config)
        return await self._update(key, update)

    async def get(self, key: str) -> Record | None:
        item = await self._read(key)
        if item is None or not items.is_live(item, Instant.now()):
            return None
        return items.to_record(key, item)

    async def reset(self, key: str, fingerprint: str | None = None) -> bool:
        update = items.reset_update(Instant.now(), self.config, fingerprint)
        return await self._update(key, update)

    async def migrate(self) -> list[str]:
        return await dynamodb_table.migrate(self._client, self._table, self.call)

    async def ping(self) -> None:
        # Through the data plane: the path, and the credentials, every delivery takes.
        await self.send("DescribeTable", {"TableName": self._table})

    async def close(self) -> None:
        if self._close_send is not None:
            self._close_send()
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        self._client.close()


def _held(refused: ClientError) -> Item | None:
    """The item a refused write collided with, where the server returns it; any other
    error ``call`` lets through is a bug in the request, never a lost race."""
    if dynamodb_table.code_of(refused) not in REFUSED:
        raise refused
    return cast("Item | None", cast(dict[str, Any], refused.response).get("Item"))


# botocore's name of each data-plane operation's method.
METHODS = {
    "PutItem": "put_item",
    "UpdateItem": "update_item",
    "GetItem": "get_item",
    "DescribeTable": "describe_table",
}


async def _botocore_send(
    client: DynamoDBClient, executor: ThreadPoolExecutor, operation: str, request: dict[str, Any]
) -> dict[str, Any]:
    method = getattr(client, METHODS[operation])
    answer = await asyncio.get_running_loop().run_in_executor(executor, partial(method, **request))
    return cast(dict[str, Any], answer)


def attempts_of(client: DynamoDBClient) -> int:
    """Every attempt botocore makes at one call, the first included."""
    retries: dict[str, int] = client.meta.config.retries  # type: ignore[attr-defined]
    return retries["total_max_attempts"]


def read_timeout(deadline: float) -> float:
    # An answer later than the call's deadline is abandoned by the consumer; the
    # request waiting for it is dropped soon after (never under the floor: a
    # loaded server's answers are not to be cut short).
    return min(READ_TIMEOUT, max(deadline, READ_TIMEOUT_FLOOR))


def _client(
    session: boto3.session.Session,
    endpoint_url: str | None,
    region: str,
    connections: int,
    deadline: float,
) -> DynamoDBClient:
    return session.client(
        "dynamodb",
        endpoint_url=endpoint_url,
        region_name=region,
        config=Config(
            connect_timeout=CONNECT_TIMEOUT,
            read_timeout=read_timeout(deadline),
            retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
            max_pool_connections=connections,
            # The requests are built by this module alone, in shapes the tests send
            # to two servers, and DynamoDB validates them again: checking each one
            # on the client too cost a fifth of the client's CPU per claim+complete.
            parameter_validation=False,
        ),
    )


async def open_store(
    *,
    table: str,
    endpoint_url: str | None,
    region: str,
    connections: int,
    config: StoreConfig,
    data_plane: DataPlaneClient = "lean",
) -> Store:
    """The store on ``table``, calling ``connections`` requests at a time at most.

    ``endpoint_url`` is ``None`` for AWS itself. Opening contacts no DynamoDB
    server, so an outage shows on first use. ``data_plane="botocore"`` sends every call
    through botocore, as the lean client's yardstick.
    """
    executor = ThreadPoolExecutor(max_workers=connections, thread_name_prefix="dynamodb")
    loop = asyncio.get_running_loop()
    # A session of its own: boto3's default session is shared and not thread-safe.
    core = await loop.run_in_executor(executor, botocore.session.Session)
    session = boto3.session.Session(botocore_session=core)
    client = await loop.run_in_executor(
        executor, _client, session, endpoint_url, region, connections, config.call_deadline
    )
    endpoint = client.meta.endpoint_url
    if data_plane == "botocore" or get_environ_proxies(endpoint):
        return DynamoDBStore(config, client, table, executor)
    lean = await open_data_plane(
        endpoint_url=endpoint,
        region=client.meta.region_name,
        credentials=await loop.run_in_executor(executor, core.get_credentials),
        ca_bundle=core.get_config_variable("ca_bundle") or get_cert_path(True),
        connections=connections,
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=read_timeout(config.call_deadline),
        attempts=attempts_of(client),
    )
    return DynamoDBStore(config, client, table, executor, lean, lean.close)
