"""DynamoDB's data plane spoken directly: JSON over :mod:`.http`, signed by :mod:`.sigv4`.

botocore spends three quarters of the client's CPU per claim + completion on
what these calls do not need (its event hooks, request model, urllib3, the
User-Agent); here a request is its JSON (orjson), a few headers and a
signature. The answers keep botocore's shape: a success is the response's
JSON, a refusal a :class:`botocore.exceptions.ClientError` with the error
dict botocore's parser builds (``Error.Code``/``Message``, and the top-level
fields of the body, such as the ``Item`` a failed condition met), so the store
sorts both clients' errors with one code. Retries follow botocore's
"standard" mode: throttling, 5xx and connection failures, jittered
exponential back-off, and a retry quota that an outage drains.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson
from botocore.credentials import Credentials, ReadOnlyCredentials, RefreshableCredentials
from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, NoCredentialsError

from semel.stores.dynamodb.http import Pool, Response
from semel.stores.dynamodb.sigv4 import Signer

TARGET = "DynamoDB_20120810."
CONTENT_TYPE = "application/x-amz-json-1.0"
# botocore's standard mode, as it is configured for DynamoDB.
THROTTLED = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)
TRANSIENT_CODES = frozenset(
    {"RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete"}
)
TRANSIENT_STATUS = frozenset({500, 502, 503, 504})
THROTTLED_SCALE = 1.0  # seconds: the first back-off's bound after a throttle
OTHER_SCALE = 0.025  # after a 5xx or a connection failure (DynamoDB's own scale)
MAX_BACKOFF = 20.0
QUOTA = 500
RETRY_COST = 14
THROTTLED_RETRY_COST = 5
# Refreshable credentials (an instance role, an assumed role) are looked at
# this often: botocore refreshes them 15 minutes before they expire, and a
# refresh may be a network call, so it runs on a thread, never on the loop.
CREDENTIALS_CHECK = 60.0
CREDENTIALS_RETRY = 1.0  # after a failed look: soon, but not on every request


class CrcMismatch(HTTPClientError):
    """The body's CRC32 is not the one DynamoDB's ``x-amz-crc32`` header says."""

    fmt = "An HTTP client error occurred: {error}"


class Keys:
    """The credentials to sign with: resolved once, refreshed off the loop when they expire."""

    def __init__(self, source: Credentials | None) -> None:
        self._source = source
        self.frozen: ReadOnlyCredentials | None = None
        self._refreshable = isinstance(source, RefreshableCredentials)
        self._check_at = 0.0
        self._failure: Exception | None = None
        self._refreshing: asyncio.Task[None] | None = None

    @classmethod
    async def resolve(cls, source: Credentials | None) -> Keys:
        """``source`` as boto3's credential chain found it (``None``: none found).

        A source that cannot answer now (an instance's metadata service down)
        fails the calls, not the opening, and is asked again meanwhile.
        """
        keys = cls(source)
        if source is not None:
            await keys._refresh()
        return keys

    def current(self) -> ReadOnlyCredentials:
        frozen = self.frozen
        if (self._refreshable or frozen is None) and self._source is not None:
            loop = asyncio.get_running_loop()
            if loop.time() >= self._check_at and self._refreshing is None:
                self._refreshing = loop.create_task(self._refresh())
        if frozen is None or not frozen.access_key or not frozen.secret_key:
            raise self._failure or NoCredentialsError()
        return frozen

    async def _refresh(self) -> None:
        assert self._source is not None
        loop = asyncio.get_running_loop()
        try:
            self.frozen = await asyncio.to_thread(self._source.get_frozen_credentials)
            self._check_at = loop.time() + CREDENTIALS_CHECK
        except Exception as exc:
            # Credentials already held stay in use: DynamoDB says when they no longer pass.
            self._failure = exc
            self._check_at = loop.time() + CREDENTIALS_RETRY
        finally:
            self._refreshing = None

    def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()


@dataclass(frozen=True, slots=True)
class Retries:
    attempts: int  # every attempt, the first included (botocore's total_max_attempts)
    random: Callable[[], float] = random.random

    def delay(self, attempt: int, throttled: bool) -> float:
        scale = THROTTLED_SCALE if throttled else OTHER_SCALE
        return self.random() * min(scale * 2.0 ** (attempt - 1), MAX_BACKOFF)


def client_error(response: Response, operation: str, attempts: int) -> ClientError:
    """The ClientError botocore raises for this error answer."""
    try:
        body = orjson.loads(response.body) if response.body else {}
    except orjson.JSONDecodeError:
        body = {"message": response.body.decode("utf-8", "replace")}
    if not isinstance(body, dict):
        body = {}
    code = str(body.get("__type", response.status)).partition(":")[0].rpartition("#")[2]
    message = body.get("message", body.get("Message", ""))
    metadata: dict[str, Any] = {"HTTPStatusCode": response.status, "RetryAttempts": attempts - 1}
    if "x-amzn-requestid" in response.headers:
        metadata["RequestId"] = response.headers["x-amzn-requestid"]
    fields = {k: v for k, v in body.items() if k not in ("__type", "message", "Message")}
    error = {**fields, "Error": {"Code": code, "Message": message}, "ResponseMetadata": metadata}
    return ClientError(error, operation)  # type: ignore[arg-type]


def _checked(response: Response) -> Response:
    expected = response.headers.get("x-amz-crc32")
    if expected is not None and int(expected) != zlib.crc32(response.body):
        raise CrcMismatch(error=f"CRC32 {zlib.crc32(response.body)}, expected {expected}")
    return response


class DataPlane:
    """Calls DynamoDB operations by name with their JSON request; answers their JSON."""

    def __init__(
        self, pool: Pool, host: str, signer: Signer, keys: Keys, retries: Retries, timeout: float
    ) -> None:
        self._pool = pool
        self._host = host
        self._signer = signer
        self._keys = keys
        self._retries = retries
        self._timeout = timeout
        self._quota = QUOTA

    def _request(self, operation: str, payload: bytes) -> bytes:
        keys = self._keys.current()
        amz_date = self._signer.amz_date()
        target = TARGET + operation
        headers = [
            ("content-type", CONTENT_TYPE),
            ("host", self._host),
            ("x-amz-date", amz_date),
            ("x-amz-target", target),
        ]
        if keys.token:
            headers.insert(3, ("x-amz-security-token", keys.token))
        signature = self._signer.sign(
            access_key=keys.access_key or "",
            secret=keys.secret_key or "",
            amz_date=amz_date,
            headers=headers,
            payload=payload,
        )
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
        head = (
            f"POST / HTTP/1.1\r\n{lines}authorization: {signature}\r\n"
            f"content-length: {len(payload)}\r\n\r\n"
        )
        return head.encode() + payload

    async def __call__(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        payload = orjson.dumps(request)
        attempt = spent = 0
        while True:
            attempt += 1
            try:
                response = _checked(
                    await self._pool.send(self._request(operation, payload), self._timeout)
                )
            except (ConnectionError, HTTPClientError):
                spent = self._retry(attempt, throttled=False)
                if not spent:
                    raise
                await asyncio.sleep(self._retries.delay(attempt, throttled=False))
                continue
            if response.status == 200:
                # A success gives back what its retries took from the quota, or 1.
                self._quota = min(QUOTA, self._quota + (spent or 1))
                answer: dict[str, Any] = orjson.loads(response.body)
                return answer
            error = client_error(response, operation, attempt)
            code = error.response["Error"]["Code"]
            throttled = code in THROTTLED
            transient = code in TRANSIENT_CODES or response.status in TRANSIENT_STATUS
            spent = self._retry(attempt, throttled=throttled) if throttled or transient else 0
            if not spent:
                raise error
            await asyncio.sleep(self._retries.delay(attempt, throttled=throttled))

    def _retry(self, attempt: int, *, throttled: bool) -> int:
        """What another attempt takes from the retry quota; 0 when none follows."""
        cost = THROTTLED_RETRY_COST if throttled else RETRY_COST
        if attempt >= self._retries.attempts or self._quota < cost:
            return 0
        self._quota -= cost
        return cost

    def close(self) -> None:
        self._keys.close()
        self._pool.close()


async def open_data_plane(
    *,
    endpoint_url: str,
    region: str,
    credentials: Credentials | None,
    ca_bundle: str | None,
    connections: int,
    connect_timeout: float,
    read_timeout: float,
    attempts: int,
) -> DataPlane:
    """A data plane on ``endpoint_url``, as the control plane's botocore client resolved it."""
    parts = urlsplit(endpoint_url)
    tls = None
    if parts.scheme == "https":
        tls = await asyncio.to_thread(ssl.create_default_context, cafile=ca_bundle)
    port = parts.port or (443 if tls else 80)
    pool = Pool(
        endpoint_url,
        parts.hostname or "",
        port,
        tls=tls,
        size=connections,
        connect_timeout=connect_timeout,
    )
    keys = await Keys.resolve(credentials)
    return DataPlane(pool, parts.netloc, Signer(region), keys, Retries(attempts), read_timeout)
