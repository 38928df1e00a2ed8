"""What the DynamoDB store makes of its server's errors, on real servers.

A small HTTP proxy on loopback stands in front of moto or dynalite and answers
chosen requests the way DynamoDB does when it throttles, fails inside or
refuses credentials; every other request reaches the real server. The rest (a
table deleted at run time, a table keyed otherwise, an item past DynamoDB's
limits) are the servers' own answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from semel.stores.base import Claim, ClaimRequest, Completion, Outcome, Status, Store
from semel.stores.dynamodb import store as dynamodb
from semel.stores.dynamodb.table import DENIED, TRANSIENT
from semel.stores.errors import EXIT_USAGE, KeyRefused, StoreMisconfigured, StoreUnavailable
from tests.conftest import SettingsFactory, StoreFactory
from tests.fences import clock_us, started_fresh
from tests.servers import free_port

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

pytestmark = pytest.mark.timeout(60)
both_servers = pytest.mark.parametrize("backend", ["dynamodb-moto", "dynamodb-dynalite"])
moto_only = pytest.mark.parametrize("backend", ["dynamodb-moto"])

FP = "f" * 64
ITEM_LIMIT = 400 * 1024  # bytes of one DynamoDB item
LONG_KEY = "k" * 3000  # past the 2048 bytes of a partition key (semel's own keys stop at 256)
PROXY_REQUESTS = 200  # one proxy serves at most this many requests, then closes them
IDLE = 5.0  # seconds a connection may stay silent, either side of the proxy
# DynamoDB's HTTP status for an error code (400 unless named) and the prefix of its type.
STATUS = {"InternalServerError": 500, "ServiceUnavailable": 503}
SERVICE = "com.amazonaws.dynamodb.v20120810#"
CORAL = "com.amazon.coral.service#"  # the credential errors come from the front end

Fault = tuple[int, bytes] | float  # an error answer (status, body), or seconds of silence


class FaultProxy(ThreadingHTTPServer):
    """Answers the next requests with queued faults, forwards the rest to ``upstream``."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.requests = 0
        self.faults: deque[Fault] = deque()
        self._lock = threading.Lock()

    def fail_next(self, count: int, code: str, prefix: str = SERVICE) -> None:
        """Answer the next ``count`` requests with ``code``, as DynamoDB sends it."""
        body = json.dumps({"__type": prefix + code, "message": f"injected {code}"}).encode()
        self.faults.extend([(STATUS.get(code, 400), body)] * count)  # deques are thread-safe

    def stall_next(self, count: int, seconds: float) -> None:
        """Leave the next ``count`` requests unanswered for ``seconds``, then hang up."""
        self.faults.extend([seconds] * count)

    def next_fault(self) -> Fault | None:
        """The fault for the request just read; ``0.0`` (hang up) past the request budget."""
        with self._lock:
            self.requests += 1
            if self.requests > PROXY_REQUESTS:
                return 0.0
            return self.faults.popleft() if self.faults else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as botocore's pool expects
    timeout = IDLE

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        proxy = cast(FaultProxy, self.server)
        fault = proxy.next_fault()
        if isinstance(fault, float):
            time.sleep(fault)
            self.close_connection = True
            return
        if fault is None:
            status, headers, payload = self._forward(proxy.upstream, body)
        else:
            status, payload = fault
            headers = [("Content-Type", "application/x-amz-json-1.0")]
        self.send_response_only(status)
        for name, value in [*headers, ("Content-Length", str(len(payload)))]:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _forward(
        self, upstream: tuple[str, int], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        hop = {"connection", "keep-alive", "transfer-encoding", "content-length"}
        connection = http.client.HTTPConnection(*upstream, timeout=IDLE * 4)
        try:
            sent = {k: v for k, v in self.headers.items() if k.lower() not in hop}
            connection.request(self.command, self.path, body, sent)
            response = connection.getresponse()
            payload = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in hop]
            return response.status, kept, payload
        finally:
            connection.close()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def proxy(make_settings: SettingsFactory) -> Iterator[FaultProxy]:
    running = FaultProxy(make_settings().dynamodb_endpoint_url or "")
    thread = threading.Thread(target=running.serve_forever, args=(0.05,))
    thread.start()
    yield running
    running.shutdown()
    running.server_close()
    thread.join(IDLE)
    assert running.requests <= PROXY_REQUESTS, "the test sent more requests than the proxy serves"


@contextlib.contextmanager
def admin(make_settings: SettingsFactory) -> Iterator[DynamoDBClient]:
    """A client of the server under test, as an operator's tools would be."""
    url = make_settings().dynamodb_endpoint_url
    client = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1")
    try:
        yield client
    finally:
        client.close()


def attempts_of(store: Store) -> int:
    """How many times botocore sends one call before it gives up (the first included)."""
    config: Any = cast(dynamodb.DynamoDBStore, store)._client.meta.config
    attempts: int = config.retries["total_max_attempts"]  # not in botocore's stubs
    return attempts


# Every passing code named by the store on moto; the two most common on dynalite too.
PASSING = [("dynamodb-moto", code) for code in sorted(TRANSIENT)] + [
    ("dynamodb-dynalite", "ThrottlingException"),
    ("dynamodb-dynalite", "InternalServerError"),
]


@pytest.mark.parametrize(("backend", "code"), PASSING)
async def test_throttling_and_server_errors_are_retried_then_unavailable(
    make_store: StoreFactory, proxy: FaultProxy, code: str
) -> None:
    store = await make_store(dynamodb_endpoint_url=proxy.url)
    attempts = attempts_of(store)
    assert attempts > 1

    # Fewer than botocore's attempts: retried away, the caller never sees them.
    proxy.fail_next(attempts - 1, code)
    since = clock_us()
    first = await store.claim("k", FP)
    assert (first.outcome, first.record.claims, len(proxy.faults)) == (Outcome.CLAIMED, 1, 0)
    assert started_fresh(first.fence, since)

    # As many as botocore's attempts: what reaches semel is StoreUnavailable.
    proxy.fail_next(attempts, code)
    with pytest.raises(StoreUnavailable) as info:
        await store.claim("other", FP)
    assert code in str(info.value)
    assert isinstance(info.value.__cause__, ClientError)
    assert len(proxy.faults) == 0  # every attempt met the fault

    # Once it passes, the same calls go through and nothing was lost.
    again = await store.claim("other", FP)
    assert (again.outcome, again.record.claims) == (Outcome.CLAIMED, 1)
    assert started_fresh(again.fence, since)
    proxy.fail_next(attempts - 1, code)
    assert await store.complete("k", first.fence, {"done": True})


@both_servers
@pytest.mark.parametrize("code", sorted(DENIED))
async def test_refused_credentials_are_misconfigured_at_once(
    make_store: StoreFactory, proxy: FaultProxy, code: str
) -> None:
    store = await make_store(dynamodb_endpoint_url=proxy.url)
    before = proxy.requests
    proxy.fail_next(1, code, prefix=CORAL)
    with pytest.raises(StoreMisconfigured) as info:
        await store.claim("k", FP)
    assert code in str(info.value)
    assert info.value.exit_code == EXIT_USAGE
    assert proxy.requests - before == 1  # not retried: it will not pass by itself

    proxy.fail_next(1, code, prefix=CORAL)
    with pytest.raises(StoreMisconfigured):
        await store.ping()
    assert (await store.claim("k", FP)).outcome is Outcome.CLAIMED  # nothing was written


@both_servers
async def test_a_table_deleted_while_open_or_keyed_otherwise_is_misconfigured(
    make_store: StoreFactory, make_settings: SettingsFactory
) -> None:
    gone, other = (f"semel_{name}_{uuid.uuid4().hex[:8]}" for name in ("gone", "other"))
    store = await make_store(dynamodb_table=gone)
    claim = await store.claim("k", FP)
    with admin(make_settings) as client:
        client.delete_table(TableName=gone)
        client.create_table(
            TableName=other,
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        end = time.monotonic() + 10  # dynalite keeps a table DELETING for a moment
        while gone in client.list_tables()["TableNames"]:
            assert time.monotonic() < end, f"table {gone} still listed"
            await asyncio.sleep(0.1)
        client.get_waiter("table_exists").wait(TableName=other, WaiterConfig={"Delay": 1})

    with pytest.raises(StoreMisconfigured, match="semel migrate"):
        await store.claim("new", FP)
    with pytest.raises(StoreMisconfigured):
        await store.complete("k", claim.fence, {"late": True})
    with pytest.raises(StoreMisconfigured):
        await store.get("k")
    with pytest.raises(StoreMisconfigured):
        await store.ping()

    keyed_otherwise = await make_store(dynamodb_table=other)  # migrate keeps any table
    with pytest.raises(StoreMisconfigured, match="not keyed on"):
        await keyed_otherwise.claim("k", FP)
    with pytest.raises(StoreMisconfigured, match="not keyed on"):
        await keyed_otherwise.get("k")


@both_servers
async def test_a_key_past_the_partition_key_limit_is_refused_alone_in_a_batch(
    make_store: StoreFactory, backend: str
) -> None:
    store = await make_store()
    ok, refused = await store.claim_many([ClaimRequest("ok", FP), ClaimRequest(LONG_KEY, FP)])
    assert isinstance(ok, Claim)
    assert ok.outcome is Outcome.CLAIMED
    assert isinstance(refused, KeyRefused)
    assert refused.key == LONG_KEY

    data = store.encode_result({"n": 1})
    done, also_refused = await store.complete_many(
        [Completion("ok", ok.fence, data), Completion(LONG_KEY, 1, data)]
    )
    assert done is True
    if backend == "dynamodb-moto":
        # moto checks a write's condition before its key's size: no item, so no owner.
        assert also_refused is False
    else:  # as DynamoDB does, the request is refused before anything is looked up
        assert isinstance(also_refused, KeyRefused)
        with pytest.raises(KeyRefused):
            await store.heartbeat(LONG_KEY, 1)


@both_servers
async def test_an_error_text_past_the_item_limit_refuses_the_key(
    make_store: StoreFactory, backend: str
) -> None:
    # A handler's exception text is stored as it is (only the result has a limit).
    store = await make_store()
    claim = await store.claim("k", FP)
    before = await store.get("k")
    with pytest.raises(KeyRefused) as info:
        await store.fail("k", claim.fence, "x" * ITEM_LIMIT)
    assert info.value.key == "k"
    if backend == "dynamodb-moto":
        return  # moto applies the SET clauses before the one past the limit, then refuses
    assert await store.get("k") == before  # as DynamoDB does: refused whole
    assert await store.fail("k", claim.fence, "short")
    record = await store.get("k")
    assert record is not None
    assert record.status is Status.FAILED


@moto_only
async def test_no_credentials_is_misconfigured(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "SESSION_TOKEN", "PROFILE"):
        monkeypatch.delenv(f"AWS_{name}", raising=False)
    for name in ("SHARED_CREDENTIALS_FILE", "CONFIG_FILE"):
        monkeypatch.setenv(f"AWS_{name}", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StoreMisconfigured, match="credentials"):
        await make_store()  # its migrate is the first call


@moto_only
async def test_an_unreachable_or_silent_server_is_unavailable(
    make_store: StoreFactory, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(StoreUnavailable, match="EndpointConnectionError"):
        await make_store(dynamodb_endpoint_url=f"http://127.0.0.1:{free_port()}")

    monkeypatch.setattr(dynamodb, "READ_TIMEOUT", 0.5)
    store = await make_store(dynamodb_endpoint_url=proxy.url)
    proxy.stall_next(attempts_of(store), 2.0)
    with pytest.raises(StoreUnavailable) as info:
        await store.claim("k", FP)
    assert isinstance(info.value.__cause__, ReadTimeoutError)
    assert (await store.claim("k", FP)).outcome is Outcome.CLAIMED
