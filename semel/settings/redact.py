"""Masking of credentials in URLs before they reach a log line or an error."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_MASK = "***"
# key=value secrets inside libpq keyword DSNs and URL query strings
# (sslpassword, a Redis URL's sentinel_password).
_SECRET_PARAMS = re.compile(r"(?i)\b(\w*password|secret|token)=([^&\s]+)")
# Any user:password@ that survived (e.g. inside an exception text).
_USERINFO = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^:/@\s]*):[^@\s]*@")


def redact(text: str) -> str:
    """Return ``text`` with passwords in URLs and ``password=`` pairs masked."""
    try:
        parts = urlsplit(text)
    except ValueError:
        parts = None
    if parts is not None and parts.scheme and parts.password is not None:
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = parts.username or ""
        text = urlunsplit(parts._replace(netloc=f"{user}:{_MASK}@{netloc}"))
    text = _USERINFO.sub(rf"\1:{_MASK}@", text)
    return _SECRET_PARAMS.sub(rf"\1={_MASK}", text)
