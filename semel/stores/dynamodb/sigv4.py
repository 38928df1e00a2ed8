"""AWS Signature Version 4 for DynamoDB's JSON requests, with the signing key kept per day.

The key is four HMACs deep (secret → date → region → service → "aws4_request")
and changes only with the date or the secret, so it is derived once a day per
secret; a request then costs two SHA-256 hashes (its body, its canonical
form) and one HMAC. The general functions below follow the specification as
written, so that AWS's published examples check them; :class:`Signer` feeds
them the few headers a DynamoDB request carries.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence

ALGORITHM = "AWS4-HMAC-SHA256"
TERMINATOR = "aws4_request"


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """The key of one day (``date`` as ``YYYYMMDD``), region and service."""
    key = _hmac(f"AWS4{secret}".encode(), date)
    key = _hmac(key, region)
    key = _hmac(key, service)
    return _hmac(key, TERMINATOR)


def canonical_request(
    method: str, path: str, query: str, headers: Sequence[tuple[str, str]], payload: bytes
) -> tuple[str, str]:
    """The canonical request and its signed-headers list.

    ``headers`` are lower-case names with trimmed values, sorted by name;
    ``path`` is already URI-encoded and ``query`` already canonical (sorted,
    encoded): DynamoDB's requests are ``POST /`` with no query.
    """
    signed = ";".join(name for name, _ in headers)
    lines = "".join(f"{name}:{value}\n" for name, value in headers)
    digest = hashlib.sha256(payload).hexdigest()
    return f"{method}\n{path}\n{query}\n{lines}\n{signed}\n{digest}", signed


def authorization(
    *,
    access_key: str,
    key: bytes,
    scope: str,
    amz_date: str,
    canonical: str,
    signed_headers: str,
) -> str:
    """The Authorization header of a canonical request, signed with a day's ``key``."""
    hashed = hashlib.sha256(canonical.encode()).hexdigest()
    string_to_sign = f"{ALGORITHM}\n{amz_date}\n{scope}\n{hashed}"
    signature = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    return (
        f"{ALGORITHM} Credential={access_key}/{scope}, "
        f"SignedHeaders={signed_headers}, Signature={signature}"
    )


class Signer:
    """Signs ``POST /`` requests for one region and service, a day's key at a time."""

    def __init__(self, region: str, service: str = "dynamodb") -> None:
        self.region = region
        self.service = service
        self._key: tuple[str, str, bytes] | None = None  # (date, secret, key)
        self._second = -1
        self._amz_date = ""

    def amz_date(self) -> str:
        """The request time, ``YYYYMMDDTHHMMSSZ`` in UTC; formatted once a second."""
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        return self._amz_date

    def key(self, secret: str, date: str) -> bytes:
        cached = self._key
        if cached is not None and cached[0] == date and cached[1] == secret:
            return cached[2]
        key = signing_key(secret, date, self.region, self.service)
        self._key = (date, secret, key)
        return key

    def sign(
        self,
        *,
        access_key: str,
        secret: str,
        amz_date: str,
        headers: Sequence[tuple[str, str]],
        payload: bytes,
    ) -> str:
        """The Authorization header of ``POST /`` with ``headers`` (as for
        :func:`canonical_request`, ``x-amz-date`` among them)."""
        date = amz_date[:8]
        canonical, signed = canonical_request("POST", "/", "", headers, payload)
        return authorization(
            access_key=access_key,
            key=self.key(secret, date),
            scope=f"{date}/{self.region}/{self.service}/{TERMINATOR}",
            amz_date=amz_date,
            canonical=canonical,
            signed_headers=signed,
        )
