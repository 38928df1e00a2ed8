"""The DynamoDB store's own client: SigV4, the connections, credentials, and a server that checks.

The signature is checked three ways: AWS's published examples (the key
derivation and the ``get-vanilla`` requests, computed here by the general
functions), botocore's signer on the very requests the store sends, and moto
with its signature checking turned on, which recomputes every signature with
the secret of an IAM user it created.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import boto3
import orjson
import pytest
import uvloop
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials, RefreshableCredentials
from botocore.exceptions import (
    ClientError,
    CredentialRetrievalError,
    NoCredentialsError,
    ReadTimeoutError,
)
from moto import settings as moto_settings
from moto.server import ThreadedMotoServer

from semel.settings import Settings
from semel.stores.base import Outcome
from semel.stores.dynamodb import sigv4, wire
from semel.stores.dynamodb.http import Pool
from semel.stores.dynamodb.store import DynamoDBStore
from semel.stores.dynamodb.wire import CrcMismatch, DataPlane, Keys, open_data_plane
from tests.conftest import StoreFactory, open_store
from tests.servers import free_port

pytestmark = pytest.mark.timeout(60)

EXAMPLE_KEY = "AKIDEXAMPLE"
EXAMPLE_SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
FP = "f" * 64


def example_authorization(query: str) -> str:
    """``GET /`` on example.amazonaws.com at 2015-08-30 12:36:00, AWS's test-suite request."""
    amz_date = "20150830T123600Z"
    headers = [("host", "example.amazonaws.com"), ("x-amz-date", amz_date)]
    canonical, signed = sigv4.canonical_request("GET", "/", query, headers, b"")
    return sigv4.authorization(
        access_key=EXAMPLE_KEY,
        key=sigv4.signing_key(EXAMPLE_SECRET, "20150830", "us-east-1", "service"),
        scope="20150830/us-east-1/service/aws4_request",
        amz_date=amz_date,
        canonical=canonical,
        signed_headers=signed,
    )


def test_sigv4_matches_aws_published_examples() -> None:
    key = sigv4.signing_key(EXAMPLE_SECRET, "20120215", "us-east-1", "iam")
    assert key.hex() == "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
    prefix = (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature="
    )
    assert example_authorization("") == (
        prefix + "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
    )
    # get-vanilla-query-order-key-case, its query in canonical (sorted) order.
    assert example_authorization("Param1=value1&Param2=value2") == (
        prefix + "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
    )


def botocore_signature(
    credentials: Credentials, headers: list[tuple[str, str]], payload: bytes
) -> str:
    """What botocore's SigV4 signer makes of the same request at the same time."""
    host = dict(headers)["host"]
    request = AWSRequest("POST", f"http://{host}/", data=payload, headers=dict(headers))
    request.context["timestamp"] = dict(headers)["x-amz-date"]
    SigV4Auth(credentials, "dynamodb", "eu-west-1").add_auth(request)
    return str(request.headers["Authorization"])


@pytest.mark.parametrize("token", [None, "session-token"])
def test_the_signature_is_botocores_on_the_store_requests(token: str | None) -> None:
    credentials = Credentials(EXAMPLE_KEY, EXAMPLE_SECRET, token)
    signer = sigv4.Signer("eu-west-1")
    amz_date = signer.amz_date()
    headers = [
        ("content-type", wire.CONTENT_TYPE),
        ("host", "127.0.0.1:8000"),
        ("x-amz-date", amz_date),
        ("x-amz-target", wire.TARGET + "PutItem"),
    ]
    if token:
        headers.insert(3, ("x-amz-security-token", token))
    payload = orjson.dumps({"TableName": "t", "Item": {"pk": {"S": "k é"}}})
    ours = signer.sign(
        access_key=EXAMPLE_KEY,
        secret=EXAMPLE_SECRET,
        amz_date=amz_date,
        headers=headers,
        payload=payload,
    )
    assert ours == botocore_signature(credentials, headers, payload)


def test_the_signing_key_is_derived_once_a_day(monkeypatch: pytest.MonkeyPatch) -> None:
    derived: list[str] = []
    real = sigv4.signing_key

    def counting(secret: str, date: str, region: str, service: str) -> bytes:
        derived.append(date)
        return real(secret, date, region, service)

    monkeypatch.setattr(sigv4, "signing_key", counting)
    signer = sigv4.Signer("us-east-1")
    headers = [("host", "h"), ("x-amz-date", "x")]
    for amz_date in ["20260101T000000Z", "20260101T120000Z", "20260101T235959Z"]:
        signer.sign(access_key="a", secret="s", amz_date=amz_date, headers=headers, payload=b"")
    assert derived == ["20260101"]
    signer.sign(
        access_key="a", secret="s", amz_date="20260102T000000Z", headers=headers, payload=b""
    )
    signer.sign(
        access_key="a", secret="new", amz_date="20260102T000001Z", headers=headers, payload=b""
    )
    assert derived == ["20260101", "20260102", "20260102"]  # a new day, a new secret


@contextlib.contextmanager
def signature_checking_moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Credentials]]:
    """moto in this process, every request's signature checked; an IAM user's credentials."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        iam = boto3.client(
            "iam",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="testing",  # not checked yet: the user is being created
            aws_secret_access_key="testing",
        )
        user = f"semel-{uuid.uuid4().hex[:8]}"
        iam.create_user(UserName=user)
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "dynamodb:*", "Resource": "*"}],
        }
        iam.put_user_policy(
            UserName=user, PolicyName="all", PolicyDocument=orjson.dumps(policy).decode()
        )
        key = iam.create_access_key(UserName=user)["AccessKey"]
        iam.close()
        # From now on moto recomputes each request's signature with the user's secret.
        monkeypatch.setattr(moto_settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
        yield url, Credentials(key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        server.stop()


async def plane(url: str, credentials: Credentials, **options: Any) -> DataPlane:
    settings: dict[str, Any] = {
        "endpoint_url": url,
        "region": "us-east-1",
        "credentials": credentials,
        "ca_bundle": None,
        "connections": 4,
        "connect_timeout": 2.0,
        "read_timeout": 5.0,
        "attempts": 3,
    }
    return await open_data_plane(**(settings | options))


async def test_a_server_that_checks_signatures_accepts_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with signature_checking_moto(monkeypatch) as (url, credentials):
        table = f"semel_signed_{uuid.uuid4().hex[:8]}"
        admin = boto3.client(
            "dynamodb",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id=credentials.access_key,
            aws_secret_access_key=credentials.secret_key,
        )
        admin.create_table(
            TableName=table,
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        admin.close()
        signed = await plane(url, credentials)
        wrong = await plane(url, Credentials(credentials.access_key, "not-the-secret"))
        try:
            item = {"pk": {"S": "k é"}, "n": {"N": "1"}}
            await signed("PutItem", {"TableName": table, "Item": item})
            got = await signed("GetItem", {"TableName": table, "Key": {"pk": {"S": "k é"}}})
            assert got["Item"] == item
            # The check is on: the same request with another secret is refused.
            with pytest.raises(ClientError) as info:
                await wrong("GetItem", {"TableName": table, "Key": {"pk": {"S": "k é"}}})
            assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
            assert "signature" in str(info.value).lower()
        finally:
            signed.close()
            wrong.close()


async def test_refreshable_credentials_are_refreshed_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    issued: list[str] = []

    def refresh() -> dict[str, str]:
        issued.append(f"KEY{len(issued)}")
        expiry = datetime.now(UTC) + timedelta(hours=1)
        return {
            "access_key": issued[-1],
            "secret_key": "secret",
            "token": "token",
            "expiry_time": expiry.isoformat(),
        }

    source = RefreshableCredentials.create_from_metadata(refresh(), refresh, "test")
    cast(Any, source)._expiry_time = datetime.now(UTC)  # expired: the next look refreshes
    monkeypatch.setattr(wire, "CREDENTIALS_CHECK", 0.0)
    keys = await Keys.resolve(source)
    assert keys.current().access_key == "KEY1"  # resolving refreshed the expired ones
    cast(Any, source)._expiry_time = datetime.now(UTC)
    assert keys.current().access_key == "KEY1"  # a request never waits for a refresh
    end = time.monotonic() + 5
    while keys.current().access_key != "KEY2":
        assert time.monotonic() < end, "never refreshed"
        await asyncio.sleep(0.01)
    keys.close()


async def test_no_credentials_fail_each_call_not_the_opening() -> None:
    keys = await Keys.resolve(None)
    with pytest.raises(NoCredentialsError):
        keys.current()


class FlakySource(Credentials):
    """Credentials whose first look fails, as an instance's metadata service that is down."""

    looks = 0

    def get_frozen_credentials(self) -> ReadOnlyCredentials:
        self.looks += 1
        if self.looks == 1:
            raise CredentialRetrievalError(provider="container-role", error_msg="down")
        return super().get_frozen_credentials()


async def test_credentials_not_found_at_first_are_looked_for_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wire, "CREDENTIALS_RETRY", 0.0)
    keys = await Keys.resolve(FlakySource("KEY", "secret"))
    with pytest.raises(CredentialRetrievalError):  # the store's calls: StoreUnavailable
        keys.current()
    end = time.monotonic() + 5
    while True:
        with contextlib.suppress(CredentialRetrievalError):
            if keys.current().access_key == "KEY":
                break
        assert time.monotonic() < end, "never looked again"
        await asyncio.sleep(0.01)
    keys.close()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    """A local server of ``handler``; on the way out its connections are waited for, closed."""
    running: set[asyncio.Task[Any]] = set()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        running.add(task)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()
        if running:  # the client has hung up by now: each handler meets its end of stream
            _, late = await asyncio.wait(running, timeout=5)
            assert not late, "a connection handler outlived its client"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return await reader.readexactly(length)


def answer(body: bytes, crc: int | None = None, close: bool = False) -> bytes:
    crc = zlib.crc32(body) if crc is None else crc
    extra = "connection: close\r\n" if close else ""
    head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\nx-amz-crc32: {crc}\r\n{extra}\r\n"
    return head.encode() + body


async def test_connections_are_kept_and_replaced_when_the_server_closes_them() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError):
            for served in range(3):  # then the server closes, as an idle timeout would
                request = orjson.loads(await read_request(reader))
                writer.write(answer(orjson.dumps({"n": request["n"]}), close=served == 2))
                await writer.drain()
        writer.close()

    async with serving(handler) as url:
        client = await plane(url, Credentials("a", "s"), connections=1)
        try:
            for n in range(7):
                assert await client("GetItem", {"n": n}) == {"n": n}
        finally:
            client.close()
    assert connections == 3  # one per three requests: kept alive, then replaced


async def test_a_corrupt_body_is_retried_then_raised() -> None:
    answers = [answer(b'{"n": 1}', crc=1), answer(b'{"n": 2}')]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError):
            while True:
                await read_request(reader)
                writer.write(answers.pop(0) if answers else answer(b"{}", crc=1))
                await writer.drain()
        writer.close()

    async with serving(handler) as url:
        client = await plane(url, Credentials("a", "s"))
        try:
            assert await client("GetItem", {}) == {"n": 2}  # the first answer's CRC was wrong
            with pytest.raises(CrcMismatch):
                await client("GetItem", {})
        finally:
            client.close()


async def test_a_call_given_up_closes_its_connection() -> None:
    received = asyncio.Event()
    closed = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        received.set()
        await reader.read()  # until the client hangs up
        closed.set()
        writer.close()

    async with serving(silent) as url:
        pool = Pool(
            url, "127.0.0.1", int(url.rsplit(":", 1)[1]), tls=None, size=1, connect_timeout=2
        )
        call = asyncio.create_task(pool.send(b"POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n", 30))
        await received.wait()
        call.cancel()  # as the store's deadline does
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(closed.wait(), 5)
        with pytest.raises(ReadTimeoutError):  # a late answer cannot reach the next request
            await pool.send(b"POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n", 0.2)
        pool.close()


@pytest.mark.parametrize("backend", ["dynamodb-moto"])
async def test_the_store_sends_its_data_plane_through_its_own_client(
    make_store: StoreFactory,
) -> None:
    store = cast(DynamoDBStore, await make_store())
    assert isinstance(store._send, DataPlane)
    claim = await store.claim("k", FP)
    assert claim.outcome is Outcome.CLAIMED
    assert await store.complete("k", claim.fence, {"ok": True})


def test_the_store_runs_on_uvloop(moto_endpoint: str) -> None:
    # The worker's loop: its transports are not asyncio's own classes.
    settings = Settings(store="dynamodb", dynamodb_endpoint_url=moto_endpoint)
    settings = settings.model_copy(update={"key_prefix": "t" + uuid.uuid4().hex[:12]})

    async def scenario() -> None:
        store = await open_store(settings)
        try:
            await store.migrate()
            claim = await store.claim("k", FP)
            assert claim.outcome is Outcome.CLAIMED
            assert await store.complete("k", claim.fence, {"ok": True})
            assert (await store.claim("k", FP)).outcome is Outcome.DUPLICATE
        finally:
            await store.close()

    uvloop.run(scenario())


async def test_an_endpoint_behind_a_proxy_keeps_botocore(monkeypatch: pytest.MonkeyPatch) -> None:
    # The store's own client speaks to the endpoint directly; botocore knows proxies.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    settings = Settings(store="dynamodb", dynamodb_endpoint_url="http://dynamodb.test:8000")
    store = cast(DynamoDBStore, await open_store(settings))  # opening sends nothing
    try:
        assert not isinstance(store._send, DataPlane)
    finally:
        await store.close()
    monkeypatch.setenv("NO_PROXY", "dynamodb.test")
    direct = cast(DynamoDBStore, await open_store(settings))
    try:
        assert isinstance(direct._send, DataPlane)
    finally:
        await direct.close()


async def test_semel_dynamodb_client_botocore_sends_every_call_through_boto3(
    moto_endpoint: str,
) -> None:
    settings = Settings(
        store="dynamodb", dynamodb_endpoint_url=moto_endpoint, dynamodb_client="botocore"
    )
    settings = settings.model_copy(update={"key_prefix": "t" + uuid.uuid4().hex[:12]})
    store = cast(DynamoDBStore, await open_store(settings))
    try:
        assert not isinstance(store._send, DataPlane)
        await store.migrate()
        claim = await store.claim("k", FP)
        assert claim.outcome is Outcome.CLAIMED
        assert await store.complete("k", claim.fence, {"ok": True})
        assert (await store.claim("k", FP)).outcome is Outcome.DUPLICATE
    finally:
        await store.close()
