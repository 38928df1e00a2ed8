"""The broker setting: one address, or the nodes of a cluster.

``SEMEL_AMQP_URL`` takes either form, or both mixed:

- one URL with several hosts, sharing credentials, virtual host and options:
  ``amqp://user:pass@rabbit-1:5672,rabbit-2,rabbit-3:5673/vhost?heartbeat=10``
- URLs separated by commas: ``amqp://user:pass@rabbit-1/vhost,amqp://user:pass@rabbit-2/vhost``

Each becomes one address (a URL naming one host). The list is split only at
a comma that starts another URL (``amqp://...``), and hosts only
after the credentials' last ``@``, so a comma in a password (RFC 3986 allows
it unencoded) never splits anything. Every address must name the same
virtual host: the nodes of one cluster share it, and two would be two sets of
queues. An address listed twice counts once.

Errors never quote the value: it may carry a password.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

AMQP_SCHEMES = ("amqp", "amqps")
_NEXT_URL = re.compile(r"\s*,\s*(?=[a-z][a-z0-9+.-]*://)", re.IGNORECASE)
_AUTHORITY_END = re.compile(r"[/?#]")


def amqp_addresses(value: str) -> tuple[str, ...]:
    """The addresses ``value`` names, in its order; ``ValueError`` says what is wrong."""
    urls = [url for url in _NEXT_URL.split(value.strip()) if url]
    if not urls:
        raise ValueError("no broker address")
    addresses: list[str] = []
    for url in urls:
        for address in _one_per_host(url):
            if address not in addresses:
                addresses.append(address)
    vhosts = set()
    for n, address in enumerate(addresses, 1):
        try:
            vhosts.add(_checked(address))
        except ValueError as exc:
            if len(addresses) == 1:
                raise
            raise ValueError(f"address {n} of {len(addresses)}: {exc}") from None
    if len(vhosts) > 1:
        raise ValueError("the addresses name different virtual hosts; a cluster shares one")
    return tuple(addresses)


def _one_per_host(url: str) -> list[str]:
    """``url`` once per host of its authority (``h1,h2:5673``)."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return [url]  # not a URL at all: _checked says so
    end = _AUTHORITY_END.search(rest)
    authority, tail = (rest[: end.start()], rest[end.start() :]) if end else (rest, "")
    userinfo, at, hosts = authority.rpartition("@")
    return [f"{scheme}://{userinfo}{at}{host.strip()}{tail}" for host in hosts.split(",")]


def _checked(address: str) -> str:
    """The virtual host of a valid address."""
    try:
        parts = urlsplit(address)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError("not a parsable URL") from None
    if parts.scheme.lower() not in AMQP_SCHEMES:
        raise ValueError("scheme must be one of " + ", ".join(f"{s}://" for s in AMQP_SCHEMES))
    if not parts.hostname:
        raise ValueError("URL has no host")
    return unquote(parts.path[1:]) or "/"  # "amqp://h/" and "amqp://h/%2F" name one
